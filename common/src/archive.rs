//! The tar archives the control plane builds itself for the engine's `put_archive`: a new
//! sandbox's skeleton, the gateway's config and policy, a claim's environment file, the seed
//! marker. (Seed archives come from clients and go through `workspace::sanitize` instead.)
//!
//! One builder so that every such archive says the same things the same way: GNU headers, an
//! explicit owner and mode on every entry (a container's `exec -u root` may have no capabilities
//! under gVisor, so ownership comes from the archive, never from a `chown` afterwards), the
//! current time as mtime, and directory names ending in `/`. The engine's fake answers its
//! `get_archive` with it too.

use std::io;

use bytes::Bytes;

use crate::shared_file::SharedFile;

/// A piece of an archive sent as it is: bytes in memory, or a file read only as it is sent.
#[derive(Clone, Debug)]
pub enum Part {
    Bytes(Bytes),
    File(SharedFile),
}

impl From<Bytes> for Part {
    fn from(b: Bytes) -> Self {
        Part::Bytes(b)
    }
}

impl From<SharedFile> for Part {
    fn from(f: SharedFile) -> Self {
        Part::File(f)
    }
}

impl Part {
    pub fn len(&self) -> u64 {
        match self {
            Part::Bytes(b) => b.len() as u64,
            Part::File(f) => f.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The bytes of a part in memory (`None` for a file).
    pub fn as_bytes(&self) -> Option<&Bytes> {
        match self {
            Part::Bytes(b) => Some(b),
            Part::File(_) => None,
        }
    }

    /// The part's bytes, a file's read whole now (a blocking read).
    pub fn to_bytes(&self) -> io::Result<Bytes> {
        match self {
            Part::Bytes(b) => Ok(b.clone()),
            Part::File(f) => f.read_all(),
        }
    }

    /// Whether `other` is this very part: the same buffer or the same file, not a copy.
    pub fn same(&self, other: &Part) -> bool {
        match (self, other) {
            (Part::Bytes(a), Part::Bytes(b)) => a.as_ptr() == b.as_ptr() && a.len() == b.len(),
            (Part::File(a), Part::File(b)) => a.same(b),
            _ => false,
        }
    }
}

/// Parts sent one after the other as one archive, read whole now (a blocking read of any file
/// part): for tests and small archives, never a sandbox's skeleton on its way to the engine.
pub fn concat(parts: &[Part]) -> io::Result<Bytes> {
    match parts {
        [Part::Bytes(one)] => Ok(one.clone()),
        parts => {
            let mut whole = Vec::new();
            for p in parts {
                whole.extend_from_slice(&p.to_bytes()?);
            }
            Ok(whole.into())
        }
    }
}

/// The owner of an entry: `(uid, gid)`.
pub type Owner = (u32, u32);

/// Root, for the service's own files: the sandbox user can read or run them, never replace them.
pub const ROOT: Owner = (0, 0);

/// The name of the entry for absolute `path` in an archive uploaded at `/`.
pub fn entry_name(path: &str) -> &str {
    path.trim_start_matches('/')
}

/// The two zero blocks that end a tar archive.
const END_MARKER: usize = 2 * 512;

/// An archive being built in memory. Entry names are relative (the archive is extracted at the
/// path given to `put_archive`, usually `/`).
pub struct Archive {
    builder: tar::Builder<Vec<u8>>,
    /// What came before the last [`Archive::shared_file`]'s data, and that data itself, in
    /// order: the builder's buffer holds what follows.
    parts: Vec<Part>,
    mtime: u64,
    /// The first entry that could not be added (a name `tar` refuses: absolute or with `..`);
    /// [`Archive::finish`] reports it. Writing to a `Vec` cannot fail otherwise.
    error: Option<io::Error>,
}

impl Default for Archive {
    fn default() -> Self {
        Self::new()
    }
}

impl Archive {
    pub fn new() -> Self {
        let mtime = u64::try_from(crate::time::unix_now()).unwrap_or(0);
        Self {
            builder: tar::Builder::new(Vec::new()),
            parts: Vec::new(),
            mtime,
            error: None,
        }
    }

    /// Adds directory `name` (a trailing `/` is added when missing).
    pub fn dir(&mut self, name: &str, mode: u32, owner: Owner) -> &mut Self {
        let name = if name.ends_with('/') {
            name.to_string()
        } else {
            format!("{name}/")
        };
        self.append(tar::EntryType::Directory, &name, mode, owner, &[])
    }

    /// Adds regular file `name` holding `data`.
    pub fn file(&mut self, name: &str, mode: u32, owner: Owner, data: &[u8]) -> &mut Self {
        self.append(tar::EntryType::Regular, name, mode, owner, data)
    }

    /// Adds symbolic link `name` to `target`.
    pub fn symlink(&mut self, name: &str, target: &str, owner: Owner) -> &mut Self {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(tar::EntryType::Symlink);
        header.set_mode(0o777);
        header.set_uid(u64::from(owner.0));
        header.set_gid(u64::from(owner.1));
        header.set_size(0);
        header.set_mtime(self.mtime);
        if let Err(e) = self.builder.append_link(&mut header, name, target)
            && self.error.is_none()
        {
            self.error = Some(e);
        }
        self
    }

    /// Adds regular file `name` holding `data` without copying it: the archive's parts
    /// ([`Archive::finish_parts`], [`Archive::finish_head_parts`]) hold `data` itself, so a file
    /// every sandbox gets (the helper binary) is in memory once, or not at all when it is a
    /// [`SharedFile`], however many archives carry it.
    pub fn shared_file(
        &mut self,
        name: &str,
        mode: u32,
        owner: Owner,
        data: impl Into<Part>,
    ) -> &mut Self {
        let data = data.into();
        // The header alone (its size says what follows); the data and its padding after it.
        let before = self.builder.get_ref().len();
        self.append(tar::EntryType::Regular, name, mode, owner, &[]);
        if self.builder.get_ref().len() == before {
            return self; // refused: `finish` reports it
        }
        let header_at = self.builder.get_ref().len() - 512;
        let mut header = tar::Header::new_gnu();
        header
            .as_mut_bytes()
            .copy_from_slice(&self.builder.get_ref()[header_at..]);
        header.set_size(data.len());
        header.set_cksum();
        self.builder.get_mut()[header_at..].copy_from_slice(header.as_bytes());
        self.parts
            .push(Bytes::from(std::mem::take(self.builder.get_mut())).into());
        let pad = (512 - data.len() % 512) % 512;
        self.parts.push(data);
        self.builder
            .get_mut()
            .resize(usize::try_from(pad).unwrap_or(0), 0);
        self
    }

    /// The archive's bytes, or the first entry that could not be added.
    /// A [`Archive::shared_file`]'s file is read whole into it: send its parts
    /// ([`Archive::finish_parts`]) instead to keep it out of memory.
    pub fn finish(self) -> io::Result<Bytes> {
        concat(&self.finish_parts()?)
    }

    /// The archive's bytes without its end marker: the head of an archive that another one
    /// (built with [`Archive::finish`]) completes when sent right after it.
    pub fn finish_head(self) -> io::Result<Bytes> {
        let whole = self.finish()?;
        // `tar` ends an archive with two zero blocks.
        Ok(whole.slice(..whole.len().saturating_sub(END_MARKER)))
    }

    /// [`Archive::finish_head`] in parts whose concatenation is the head: a
    /// [`Archive::shared_file`]'s data is one of them, not copied.
    pub fn finish_head_parts(self) -> io::Result<Vec<Part>> {
        let mut parts = self.finish_parts()?;
        // The last part is the builder's buffer, never a shared file.
        if let Some(Part::Bytes(last)) = parts.last_mut() {
            *last = last.slice(..last.len().saturating_sub(END_MARKER));
        }
        parts.retain(|p| !p.is_empty());
        Ok(parts)
    }

    /// The whole archive as parts whose concatenation is it: a [`Archive::shared_file`]'s data
    /// is one of them, not copied. The builder's last buffer (with the end marker) is last.
    pub fn finish_parts(mut self) -> io::Result<Vec<Part>> {
        if let Some(e) = self.error.take() {
            return Err(e);
        }
        let last = self.builder.into_inner()?;
        self.parts.push(Bytes::from(last).into());
        Ok(self.parts)
    }

    fn append(
        &mut self,
        kind: tar::EntryType,
        name: &str,
        mode: u32,
        (uid, gid): Owner,
        data: &[u8],
    ) -> &mut Self {
        let mut header = tar::Header::new_gnu();
        header.set_entry_type(kind);
        header.set_mode(mode);
        header.set_uid(u64::from(uid));
        header.set_gid(u64::from(gid));
        header.set_size(data.len() as u64);
        header.set_mtime(self.mtime);
        if let Err(e) = self.builder.append_data(&mut header, name, data)
            && self.error.is_none()
        {
            self.error = Some(e);
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_symlink_entry_names_its_target() -> io::Result<()> {
        let mut a = Archive::new();
        a.symlink("d/link", "/elsewhere/file", ROOT);
        let bytes = a.finish()?;
        let mut archive = tar::Archive::new(&bytes[..]);
        let entry = archive.entries()?.next().expect("one entry")?;
        assert_eq!(entry.header().entry_type(), tar::EntryType::Symlink);
        assert_eq!(entry.path()?.to_str(), Some("d/link"));
        let target = entry.link_name()?.expect("a target");
        assert_eq!(target.to_str(), Some("/elsewhere/file"));
        Ok(())
    }

    #[test]
    fn entries_carry_their_owner_mode_and_kind() -> io::Result<()> {
        let mut a = Archive::new();
        a.dir("d", 0o700, (7, 8))
            .file("d/f", 0o644, ROOT, b"hi")
            .dir("e/", 0o755, ROOT);
        let bytes = a.finish()?;
        let mut seen = Vec::new();
        for entry in tar::Archive::new(&bytes[..]).entries()? {
            let entry = entry?;
            let h = entry.header();
            seen.push((
                entry
                    .path()?
                    .display()
                    .to_string()
                    .trim_end_matches('/')
                    .to_string(),
                h.entry_type().is_dir(),
                h.mode()?,
                h.uid()?,
                h.gid()?,
                h.size()?,
            ));
            assert!(h.mtime()? > 0);
        }
        assert_eq!(
            seen,
            [
                ("d".to_string(), true, 0o700, 7, 8, 0),
                ("d/f".to_string(), false, 0o644, 0, 0, 2),
                ("e".to_string(), true, 0o755, 0, 0, 0),
            ]
        );
        Ok(())
    }

    #[test]
    fn a_head_and_an_archive_after_it_read_as_one_archive() -> io::Result<()> {
        let mut head = Archive::new();
        head.dir("d", 0o755, ROOT)
            .file("d/big", 0o644, ROOT, &[7; 700]);
        let head = head.finish_head()?;
        let mut tail = Archive::new();
        tail.file("d/own", 0o644, (1, 1), b"mine");
        let whole = [head, tail.finish()?].concat();
        let mut names = Vec::new();
        for entry in tar::Archive::new(&whole[..]).entries()? {
            names.push(entry?.path()?.display().to_string());
        }
        assert_eq!(names, ["d/", "d/big", "d/own"]);
        Ok(())
    }

    #[test]
    fn a_shared_file_is_not_copied_and_reads_as_any_other() -> io::Result<()> {
        let content = vec![9u8; 1300];
        // In memory, and in a private file read only as the archive is sent.
        let shared: [Part; 2] = [
            Bytes::from(content.clone()).into(),
            SharedFile::from_bytes(&content)?.into(),
        ];
        for big in shared {
            let mut head = Archive::new();
            head.dir("d", 0o755, ROOT)
                .shared_file("d/bin", 0o755, ROOT, big.clone())
                .dir("e", 0o700, (1, 1));
            let parts = head.finish_head_parts()?;
            // The data itself is one of the parts: the same buffer or file, not a copy.
            assert!(parts.iter().any(|p| p.same(&big)), "{big:?}");
            let mut tail = Archive::new();
            tail.file("d/own", 0o644, (1, 1), b"mine");
            let mut whole: Vec<u8> = concat(&parts)?.to_vec();
            whole.extend_from_slice(&tail.finish()?);
            let mut seen = Vec::new();
            for entry in tar::Archive::new(&whole[..]).entries()? {
                let mut entry = entry?;
                let mut data = Vec::new();
                io::Read::read_to_end(&mut entry, &mut data)?;
                seen.push((
                    entry.path()?.display().to_string(),
                    entry.header().mode()?,
                    data,
                ));
            }
            assert_eq!(
                seen,
                [
                    ("d/".to_string(), 0o755, vec![]),
                    ("d/bin".to_string(), 0o755, content.clone()),
                    ("e/".to_string(), 0o700, vec![]),
                    ("d/own".to_string(), 0o644, b"mine".to_vec()),
                ]
            );
        }
        Ok(())
    }

    #[test]
    fn a_refused_name_is_reported_by_finish() {
        let mut a = Archive::new();
        a.file("../escape", 0o644, ROOT, b"x")
            .file("ok", 0o644, ROOT, b"y");
        assert!(a.finish().is_err());
    }
}
