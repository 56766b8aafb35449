//! The workspace: seeding it from archives ([`seed`]) and the Python-free file operations
//! ([`fs`]), over the session runtime (the in-container helper, running as `RUN_UID:RUN_GID`:
//! the container's own permissions apply, and nothing is written as root through a path the
//! sandbox controls). `/workspace` is a per-session volume.
//!
//! # Layout
//! - The request and response types (DAIV validates responses against its schemas) are
//!   `sandbox_protocol::wire`'s: the helper answers with them and the API serves them as they are.
//! - [`sanitize`]: the synchronous tar sanitiser behind seeding.
//! - [`seed`]: the streaming seed pipeline and its one-shot marker.
//! - [`fs`]: `ls`, `read`, `grep`, `glob`, `write`, `edit`, `delete`.

use std::io::{self, Read, Write};

use bytes::{Bytes, BytesMut};
use tokio::sync::mpsc;

pub mod fs;
pub mod multipart;
pub mod sanitize;
pub mod seed;

pub use crate::text::shown;
pub use sandbox_protocol::wire::validate_path;

// === impl ChannelReader / ChannelWriter ===

/// The blocking end of an async → sync byte pipe: a bounded channel, so the producer waits when
/// the sanitiser is behind and memory stays at a few chunks.
pub(crate) struct ChannelReader {
    rx: mpsc::Receiver<Bytes>,
    cur: Bytes,
}

impl ChannelReader {
    pub fn new(rx: mpsc::Receiver<Bytes>) -> Self {
        Self {
            rx,
            cur: Bytes::new(),
        }
    }
}

impl Read for ChannelReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.cur.is_empty() {
            match self.rx.blocking_recv() {
                Some(b) => self.cur = b,
                None => return Ok(0),
            }
        }
        let n = buf.len().min(self.cur.len());
        buf[..n].copy_from_slice(&self.cur[..n]);
        let _ = self.cur.split_to(n);
        Ok(n)
    }
}

/// The blocking start of a sync → async byte pipe, batching writes into 64 KiB chunks.
pub(crate) struct ChannelWriter {
    tx: mpsc::Sender<io::Result<Bytes>>,
    buf: BytesMut,
}

const WRITE_CHUNK: usize = 64 * 1024;

impl ChannelWriter {
    pub fn new(tx: mpsc::Sender<io::Result<Bytes>>) -> Self {
        Self {
            tx,
            buf: BytesMut::with_capacity(WRITE_CHUNK),
        }
    }

    fn send(&mut self) -> io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let chunk = self.buf.split().freeze();
        self.tx
            .blocking_send(Ok(chunk))
            .map_err(|_| io::Error::new(io::ErrorKind::BrokenPipe, "archive consumer went away"))
    }

    /// Makes the consumer's stream fail, so a half-written archive is never taken as complete.
    pub fn abort(self, why: &str) {
        let _ = self
            .tx
            .blocking_send(Err(io::Error::other(why.to_string())));
    }
}

impl Write for ChannelWriter {
    fn write(&mut self, data: &[u8]) -> io::Result<usize> {
        self.buf.extend_from_slice(data);
        if self.buf.len() >= WRITE_CHUNK {
            self.send()?;
        }
        Ok(data.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}
