//! A file sent into many archives without being held in memory (the helper binary every sandbox
//! gets: 3.7 MB that would otherwise be most of an idle service's private memory).

use std::fs::File;
use std::io::{self, Read, Write};
use std::os::unix::fs::FileExt;
use std::sync::Arc;

use bytes::Bytes;

use crate::ids::{FNV_OFFSET, fnv_more};

/// A private copy of a file's content, read when an archive holding it is sent. The copy has no
/// name (`O_TMPFILE` where the temporary directory supports it), so nothing can change what the
/// service sends after it checked it, whatever happens to the original (a rebuild in place, a
/// truncation); and its pages are the kernel's cache, not the service's memory (unless `TMPDIR`
/// is a tmpfs, where they are memory the kernel cannot evict, charged to the service). Where no
/// temporary file can be made (a read-only root without a writable `TMPDIR`), the copy is held
/// in memory instead: the same guarantees, not the memory.
#[derive(Clone, Debug)]
pub struct SharedFile {
    copy: Held,
    len: u64,
    /// [`crate::ids::fnv`] of the content, taken as it was copied.
    fingerprint: u64,
}

#[derive(Clone, Debug)]
enum Held {
    File(Arc<File>),
    Memory(Bytes),
}

impl SharedFile {
    /// Copies everything `from` reads into a new private file, or into memory where none can be
    /// made ([`SharedFile::in_memory`]).
    pub fn copy_of(from: &mut impl Read) -> io::Result<Self> {
        let Ok(file) = tempfile::tempfile() else {
            let mut data = Vec::new();
            from.read_to_end(&mut data)?;
            return Ok(Self {
                len: data.len() as u64,
                fingerprint: crate::ids::fnv(&data),
                copy: Held::Memory(data.into()),
            });
        };
        Self::copy_into(from, file)
    }

    fn copy_into(from: &mut impl Read, mut copy: File) -> io::Result<Self> {
        let (mut len, mut hash) = (0u64, FNV_OFFSET);
        let mut buf = vec![0; 64 * 1024];
        loop {
            let n = match from.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            };
            copy.write_all(&buf[..n])?;
            hash = fnv_more(hash, &buf[..n]);
            len += n as u64;
        }
        Ok(Self {
            copy: Held::File(Arc::new(copy)),
            len,
            fingerprint: hash,
        })
    }

    /// [`crate::ids::fnv`] of the content: a change detector (a pool member made with another
    /// helper is replaced), not a security property.
    pub fn fingerprint(&self) -> u64 {
        self.fingerprint
    }

    /// A private file holding `data` (tests, and content that is already in memory).
    pub fn from_bytes(data: &[u8]) -> io::Result<Self> {
        Self::copy_of(&mut &data[..])
    }

    pub fn len(&self) -> u64 {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `len` bytes from offset `at` (a blocking read: call it off the async workers).
    pub fn read_at(&self, at: u64, len: usize) -> io::Result<Bytes> {
        match &self.copy {
            Held::File(file) => {
                let mut buf = vec![0; len];
                file.read_exact_at(&mut buf, at)?;
                Ok(Bytes::from(buf))
            }
            Held::Memory(data) => usize::try_from(at)
                .ok()
                .and_then(|at| Some(at..at.checked_add(len)?))
                .filter(|r| r.end <= data.len())
                .map(|r| data.slice(r))
                .ok_or_else(|| io::Error::from(io::ErrorKind::UnexpectedEof)),
        }
    }

    /// Whether the copy is held in memory (no temporary file could be made).
    pub fn in_memory(&self) -> bool {
        matches!(self.copy, Held::Memory(_))
    }

    /// The whole content, read now (a blocking read).
    pub fn read_all(&self) -> io::Result<Bytes> {
        let len = usize::try_from(self.len).map_err(io::Error::other)?;
        self.read_at(0, len)
    }

    /// Whether `other` is this very copy (not merely the same content).
    pub fn same(&self, other: &Self) -> bool {
        match (&self.copy, &other.copy) {
            (Held::File(a), Held::File(b)) => Arc::ptr_eq(a, b),
            (Held::Memory(a), Held::Memory(b)) => a.as_ptr() == b.as_ptr() && a.len() == b.len(),
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_copy_reads_back_whole_and_in_pieces() -> io::Result<()> {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i % 251) as u8).collect();
        let f = SharedFile::from_bytes(&data)?;
        assert!(!f.in_memory());
        assert_eq!(f.len(), data.len() as u64);
        assert_eq!(&f.read_all()?[..], &data[..]);
        assert_eq!(&f.read_at(65_536, 10)?[..], &data[65_536..65_546]);
        // Past the end is an error, never a short read.
        assert!(f.read_at(199_995, 10).is_err());
        assert!(f.same(&f.clone()));
        assert_eq!(f.fingerprint(), crate::ids::fnv(&data));
        assert!(!f.same(&SharedFile::from_bytes(&data)?));
        Ok(())
    }

    #[test]
    fn a_copy_in_memory_reads_as_a_file_does() -> io::Result<()> {
        let data: Vec<u8> = (0..70_000u32).map(|i| (i % 249) as u8).collect();
        let f = SharedFile {
            copy: Held::Memory(Bytes::from(data.clone())),
            len: data.len() as u64,
            fingerprint: crate::ids::fnv(&data),
        };
        assert!(f.in_memory());
        assert_eq!(&f.read_all()?[..], &data[..]);
        assert_eq!(&f.read_at(65_536, 10)?[..], &data[65_536..65_546]);
        assert!(f.read_at(69_995, 10).is_err());
        assert!(f.read_at(u64::MAX, 1).is_err());
        assert!(f.same(&f.clone()));
        Ok(())
    }

    #[test]
    fn the_copy_does_not_follow_its_original() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("bin");
        std::fs::write(&path, b"version one")?;
        let f = SharedFile::copy_of(&mut File::open(&path)?)?;
        // Rebuilt in place, then truncated: the copy still says what was checked.
        std::fs::write(&path, b"VERSION TWO")?;
        std::fs::write(&path, b"")?;
        assert_eq!(&f.read_all()?[..], b"version one");
        Ok(())
    }
}
