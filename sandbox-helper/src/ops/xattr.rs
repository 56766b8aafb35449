//! A file's metadata as E2B keeps it: `user.e2b.<key>` extended attributes, read into every
//! entry the data plane describes and replaced by a write that brings metadata. As the sandbox
//! user, like every data-plane op: the kernel decides (a file system without user attributes
//! has no metadata, and a write with some is refused).

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::XattrFlags;
use rustix::io::Errno;

/// The namespace E2B's metadata lives in.
pub const PREFIX: &[u8] = b"user.e2b.";

/// Largest attribute list read (Linux's own limit is 64 KiB; ext4 keeps about a block's worth).
const LIST_MAX: usize = 16 * 1024;
/// Largest value read; a longer one is skipped.
const VALUE_MAX: usize = 4096;
/// Most keys, and most bytes of keys and values, an entry carries: what an upload may set (the
/// control plane's bounds). Attributes set inside the sandbox past them are left out, so an
/// entry stays small (a stat answer and a watch event have a size the channel holds to).
const KEYS_MAX: usize = 32;
const TOTAL_MAX: usize = 3072;

/// The `user.e2b.*` attributes of `name` in `dir`, by key (the prefix stripped); values that are
/// not UTF-8 are left out. Read through `/proc/self/fd`, so the name is looked up in the
/// directory already resolved, never through a path the sandbox could change meanwhile, and a
/// final symlink is not followed.
pub fn read_at(dir: &OwnedFd, name: &OsStr) -> BTreeMap<String, String> {
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name.as_bytes());
    let path = OsStr::from_bytes(&path);
    let mut list = vec![0u8; LIST_MAX];
    let Ok(n) = rustix::fs::llistxattr(path, &mut list[..]) else {
        return BTreeMap::new();
    };
    let mut out = BTreeMap::new();
    let mut value = vec![0u8; VALUE_MAX];
    let mut total = 0usize;
    for attr in ours(&list[..n]) {
        if out.len() == KEYS_MAX {
            break;
        }
        let Ok(len) = rustix::fs::lgetxattr(path, attr, &mut value[..]) else {
            continue;
        };
        if let (Ok(key), Ok(v)) = (
            std::str::from_utf8(&attr.as_bytes()[PREFIX.len()..]),
            std::str::from_utf8(&value[..len]),
        ) {
            total += key.len() + v.len();
            if total > TOTAL_MAX {
                break;
            }
            out.insert(key.to_string(), v.to_string());
        }
    }
    out
}

/// Makes `metadata` the `user.e2b.*` attributes of the open file `fd`: every other one of that
/// namespace is removed first.
pub fn replace(fd: &impl AsFd, metadata: &BTreeMap<String, String>) -> Result<(), Errno> {
    let mut list = vec![0u8; LIST_MAX];
    let n = match rustix::fs::flistxattr(fd, &mut list[..]) {
        Ok(n) => n,
        // No attributes here at all: nothing to remove (and nothing to set, checked below).
        Err(Errno::NOTSUP) if metadata.is_empty() => return Ok(()),
        Err(e) => return Err(e),
    };
    for attr in ours(&list[..n]) {
        let key = &attr.as_bytes()[PREFIX.len()..];
        if !metadata.contains_key(&*String::from_utf8_lossy(key)) {
            match rustix::fs::fremovexattr(fd, attr) {
                Ok(()) | Err(Errno::NODATA) => {}
                Err(e) => return Err(e),
            }
        }
    }
    for (key, value) in metadata {
        let mut attr = PREFIX.to_vec();
        attr.extend_from_slice(key.as_bytes());
        rustix::fs::fsetxattr(
            fd,
            OsStr::from_bytes(&attr),
            value.as_bytes(),
            XattrFlags::empty(),
        )?;
    }
    Ok(())
}

/// The names in a NUL-separated attribute list that are E2B's metadata.
fn ours(list: &[u8]) -> impl Iterator<Item = &OsStr> {
    list.split(|b| *b == 0)
        .filter(|a| a.len() > PREFIX.len() && a.starts_with(PREFIX))
        .map(OsStr::from_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_e2b_namespace_is_ours() {
        let list = b"security.selinux\0user.e2b.author\0user.other\0user.e2b.\0user.e2b.tag\0";
        let names: Vec<_> = ours(list).collect();
        assert_eq!(
            names,
            [OsStr::new("user.e2b.author"), OsStr::new("user.e2b.tag")]
        );
    }

    /// Written, read back by name in its directory, replaced (the key left out removed), and
    /// cleared by an empty map: on the test machine's own file system, which has user
    /// attributes (tmpfs since Linux 6.6, ext4, xfs); one without them is said, not skipped.
    #[test]
    fn metadata_is_written_read_and_replaced() {
        let dir = tempfile::tempdir().expect("tempdir");
        let file = dir.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        let fd = std::fs::File::open(&file).expect("open");
        let d = rustix::fs::open(
            dir.path(),
            rustix::fs::OFlags::DIRECTORY | rustix::fs::OFlags::RDONLY,
            rustix::fs::Mode::empty(),
        )
        .expect("dir");
        let two: BTreeMap<String, String> = [
            ("author".into(), "mish".into()),
            ("purpose".into(), "upload".into()),
        ]
        .into();
        replace(&fd, &two).expect("this file system keeps user attributes");
        assert_eq!(read_at(&d, OsStr::new("f")), two);
        let one: BTreeMap<String, String> = [("purpose".into(), "kept".into())].into();
        replace(&fd, &one).expect("replace");
        assert_eq!(read_at(&d, OsStr::new("f")), one);
        replace(&fd, &BTreeMap::new()).expect("clear");
        assert!(read_at(&d, OsStr::new("f")).is_empty());
        assert!(read_at(&d, OsStr::new("missing")).is_empty());
    }
}
