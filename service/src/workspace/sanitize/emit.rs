//! The output side: the per-archive bookkeeping behind the symlink and no-write-through guards
//! (the second and third in the parent module's docs), first-wins on names, parents synthesised
//! as sandbox-owned directories, and the plain tar written with normalised owners and modes.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;

use tar::{Builder, EntryType, Header};

use super::names::{normalize, normalize_mode};
use super::{Options, PATH_MAX, SanitizeError, shown};

/// Remembers whether the consumer failed, so its error is not reported as a corrupt archive.
pub(super) struct Watched<'a, W> {
    pub(super) inner: W,
    pub(super) failed: &'a Cell<bool>,
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
pub(super) struct State {
    uid: u64,
    gid: u64,
    prefix: Vec<u8>,
    /// Every emitted name (relative to the root) and what it is.
    emitted: HashMap<Vec<u8>, Kind>,
    /// Directories that an accepted symlink target walked through lexically: a later symlink
    /// with one of these names would make that earlier target resolve elsewhere.
    walked: HashSet<Vec<u8>>,
    pub(super) skipped: u64,
    /// Entries counted against the budget's member limit (all archives of the request so far).
    pub(super) members_used: u64,
    member_limit: u64,
}

pub(super) enum MemberError {
    Refused(SanitizeError),
    Io(io::Error),
}

impl From<io::Error> for MemberError {
    fn from(e: io::Error) -> Self {
        MemberError::Io(e)
    }
}

impl State {
    pub(super) fn new(opts: &Options, members_used: u64, member_limit: u64) -> Self {
        Self {
            uid: opts.uid,
            gid: opts.gid,
            prefix: opts.prefix.as_bytes().to_vec(),
            emitted: HashMap::new(),
            walked: HashSet::new(),
            skipped: 0,
            members_used,
            member_limit,
        }
    }

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

    pub(super) fn emit_root<W: Write>(&mut self, b: &mut Builder<W>) -> io::Result<()> {
        let mut h = self.header(EntryType::Directory, 0o755, 0);
        let name = self.prefix.clone();
        b.append_data(&mut h, OsStr::from_bytes(&name), io::empty())
    }

    /// One more entry against the member limit.
    pub(super) fn count_member(&mut self) -> Result<(), MemberError> {
        self.members_used += 1;
        if self.members_used > self.member_limit {
            return Err(MemberError::Refused(SanitizeError::TooManyMembers {
                limit: self.member_limit,
            }));
        }
        Ok(())
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

    /// Sandbox-owned entries for every ancestor not yet emitted, top-down; each one counts as a
    /// member.
    fn ensure_parents<W: Write>(
        &mut self,
        b: &mut Builder<W>,
        comps: &[&[u8]],
    ) -> Result<(), MemberError> {
        for i in 1..comps.len() {
            let ancestor = comps[..i].join(&b'/');
            if !self.emitted.contains_key(&ancestor) {
                self.count_member()?;
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
        tracing::warn!(member = %shown(name), reason = why, "skipping archive member");
    }

    pub(super) fn member<R: Read, W: Write>(
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
        if kind == Kind::Symlink
            && entry
                .link_name_bytes()
                .is_some_and(|t| t.len() as u64 >= PATH_MAX)
        {
            return Err(MemberError::Refused(SanitizeError::LinkTooLong));
        }
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
