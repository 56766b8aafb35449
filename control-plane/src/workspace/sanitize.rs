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

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{self, Chain, Cursor, Read, Write};
use std::os::unix::ffi::OsStrExt;

use tar::{Builder, EntryType, Header};

/// Why an archive was refused as a whole.
#[derive(Debug, thiserror::Error)]
pub enum SanitizeError {
    #[error("archive member has an absolute name: {0:?}")]
    Absolute(String),
    #[error("archive member name contains '..': {0:?}")]
    Traversal(String),
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

/// Limits shared by all archives of one seed request, and what is left of them.
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
        Compression::Xz => Box::new(liblzma::read::XzDecoder::new_multi_decoder(whole)),
        Compression::Zstd => Box::new(zstd::stream::read::Decoder::new(whole)?),
    })
}

/// Counts decompressed bytes against the budget; going over is an error the tar reader passes up.
struct Counted<'a, R> {
    inner: R,
    budget: &'a mut Budget,
    exceeded: &'a std::cell::Cell<bool>,
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

/// Remembers whether the consumer failed, so its error is not reported as a corrupt archive.
struct Watched<'a, W> {
    inner: W,
    failed: &'a std::cell::Cell<bool>,
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
}

/// Sanitises `input` (plain or compressed tar) into a plain tar on `output`.
pub fn sanitize<R: Read, W: Write>(
    input: R,
    output: W,
    opts: &Options,
    budget: &mut Budget,
) -> Result<Stats, SanitizeError> {
    let exceeded = std::cell::Cell::new(false);
    let out_failed = std::cell::Cell::new(false);
    let member_limit = budget.max_members;
    let size_limit = budget.max_bytes;
    let classify = |e: io::Error, exceeded: bool, out_failed: bool| {
        if exceeded {
            SanitizeError::TooLarge { limit: size_limit }
        } else if out_failed {
            SanitizeError::OutputClosed
        } else {
            SanitizeError::Corrupt(e.to_string())
        }
    };
    let decoded = decoder(input).map_err(|e| classify(e, false, false))?;
    let members_before = budget.members_used;
    let mut members_used = budget.members_used;
    let counted = Counted {
        inner: decoded,
        budget,
        exceeded: &exceeded,
    };
    let mut archive = tar::Archive::new(counted);
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
    };
    let result = (|| -> Result<(), SanitizeError> {
        let io_err = |e: io::Error| classify(e, exceeded.get(), out_failed.get());
        st.emit_root(&mut builder).map_err(io_err)?;
        let entries = archive.entries().map_err(io_err)?;
        for entry in entries {
            let entry = entry.map_err(io_err)?;
            let etype = entry.header().entry_type();
            if matches!(etype, EntryType::XGlobalHeader | EntryType::XHeader) {
                continue;
            }
            members_used += 1;
            if members_used > member_limit {
                return Err(SanitizeError::TooManyMembers {
                    limit: member_limit,
                });
            }
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
    budget.members_used = members_used;
    result?;
    if st.skipped > 0 {
        tracing::warn!(
            skipped = st.skipped,
            members = members_used - members_before,
            prefix = %opts.prefix,
            "archive sanitisation dropped members"
        );
    }
    Ok(Stats {
        members: members_used - members_before,
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
    let shown = || String::from_utf8_lossy(raw).into_owned();
    if raw.starts_with(b"/") {
        return Err(SanitizeError::Absolute(shown()));
    }
    let comps: Vec<&[u8]> = raw
        .split(|b| *b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
        .collect();
    if comps.iter().any(|c| *c == b"..") {
        return Err(SanitizeError::Traversal(shown()));
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

    /// Sandbox-owned entries for every ancestor not yet emitted, top-down.
    fn ensure_parents<W: Write>(&mut self, b: &mut Builder<W>, comps: &[&[u8]]) -> io::Result<()> {
        for i in 1..comps.len() {
            let ancestor = comps[..i].join(&b'/');
            if !self.emitted.contains_key(&ancestor) {
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
        tracing::warn!(member = %String::from_utf8_lossy(name), reason = why, "skipping archive member");
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
}
