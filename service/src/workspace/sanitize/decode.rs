//! Decompression with bounds: which codec the first bytes call for, how much memory its window or
//! dictionary may take, and how many decompressed bytes the archive has cost the [`Budget`].
//! The compressed size says nothing about either, so both are bounded here, before the tar reader
//! sees a byte.

use std::cell::Cell;
use std::io::{self, Chain, Cursor, Read};

use super::Budget;

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
pub(super) fn decoder<'a, R: Read + 'a>(mut input: R) -> io::Result<Box<dyn Read + 'a>> {
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
        Compression::Xz => Box::new(xz_decoder(whole, DECODER_MEMORY)?),
        Compression::Zstd => {
            let mut d = zstd::stream::read::Decoder::new(whole)?;
            // The format allows windows of up to 2 GiB; the archive says which it wants.
            d.window_log_max(DECODER_MEMORY.ilog2())?;
            Box::new(d)
        }
    })
}

/// Most memory a decompressor may take for its window or dictionary (xz -9 and zstd -19 fit):
/// an archive's header chooses it, so without a bound ~200 KB of upload could claim gigabytes.
pub(super) const DECODER_MEMORY: u64 = 128 * 1024 * 1024;

/// An xz decoder (concatenated streams) that refuses archives needing more than `memlimit`.
pub(super) fn xz_decoder<R: Read>(r: R, memlimit: u64) -> io::Result<liblzma::read::XzDecoder<R>> {
    let stream =
        liblzma::stream::Stream::new_stream_decoder(memlimit, liblzma::stream::CONCATENATED)
            .map_err(io::Error::other)?;
    Ok(liblzma::read::XzDecoder::new_stream(r, stream))
}

/// Counts decompressed bytes against the budget; going over is an error the tar reader passes up.
pub(super) struct Counted<'a, R> {
    pub(super) inner: R,
    pub(super) budget: &'a mut Budget,
    pub(super) exceeded: &'a Cell<bool>,
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
