//! The helper's operations: what each request does, given a [`Stop`] to honour and, for
//! `write`/`extract`, its [`Input`]. The server ([`crate::server`]) decodes requests and turns
//! what an op returns into its response; the ops know nothing of frames.
//!
//! - [`resolve`]: path resolution confined to the workspace root, which every op goes through.
//! - [`fs`]: `ls`, `read`, `grep`, `glob`, `write`, `edit`, `delete`.
//! - [`text`]: paging (`read`) and replacement (`edit`); [`ere`]: POSIX ERE for `grep`.
//! - [`run`]: a `run` request's commands.
//! - [`extract`]: `extract` (a seed tar) and `clear`.
//! - [`files`]: the data plane on paths anywhere: `stat`, `mkdir`, `move`, `list`, raw reads
//!   and atomic writes.
//! - [`watch`]: a directory's changes, from inotify.
//! - [`xattr`]: a file's metadata (E2B's `user.e2b.*` extended attributes).

use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use sandbox_protocol::message::ErrorKind;
use sandbox_protocol::wire::{FsError, FsErrorCode};

pub mod ere;
pub mod extract;
pub mod files;
pub mod fs;
pub mod resolve;
pub mod run;
pub mod text;
pub mod watch;
pub mod xattr;

/// How often blocked waits look at the cancel flag and the deadline.
pub(crate) const TICK: Duration = Duration::from_millis(20);

/// Why an op stopped before finishing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Halt {
    Cancelled,
    Deadline,
}

/// Cancellation and deadline of one request, checked between units of work.
pub struct Stop<'a> {
    pub cancelled: &'a AtomicBool,
    pub deadline: Option<Instant>,
}

impl Stop<'_> {
    pub fn check(&self) -> Result<(), Halt> {
        if self.cancelled.load(Ordering::Relaxed) {
            return Err(Halt::Cancelled);
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Halt::Deadline);
        }
        Ok(())
    }

    /// [`Self::check`] as an `io::Error`, for code behind `Read`; the op asks [`Self::check`]
    /// again to tell a halt from a real I/O failure.
    pub fn check_io(&self) -> io::Result<()> {
        self.check().map_err(|h| io::Error::other(format!("{h:?}")))
    }
}

/// An op's failure: an fs-level problem (answered as `ok` with `error` set), a halt, or a
/// protocol-level error response.
#[derive(Debug)]
pub enum OpError {
    Fs(FsError),
    Halt(Halt),
    Fail(ErrorKind, String),
}

impl From<Halt> for OpError {
    fn from(h: Halt) -> Self {
        OpError::Halt(h)
    }
}

impl From<FsError> for OpError {
    fn from(e: FsError) -> Self {
        OpError::Fs(e)
    }
}

pub(crate) fn fail(code: FsErrorCode, message: impl Into<String>) -> OpError {
    OpError::Fs(FsError::new(code, message))
}

/// One message of a request's input stream.
pub enum InputMsg {
    Data(Vec<u8>),
    Eof,
}

/// The receiving end of a request's input (DATA frames until EOF).
pub struct Input {
    rx: Receiver<InputMsg>,
    done: bool,
}

impl Input {
    pub fn new(rx: Receiver<InputMsg>) -> Self {
        Input { rx, done: false }
    }

    /// The next chunk, `None` at EOF (a vanished sender counts as EOF).
    pub fn next(&mut self, stop: &Stop<'_>) -> Result<Option<Vec<u8>>, Halt> {
        loop {
            if self.done {
                return Ok(None);
            }
            stop.check()?;
            match self.rx.recv_timeout(TICK) {
                Ok(InputMsg::Data(d)) => return Ok(Some(d)),
                Ok(InputMsg::Eof) | Err(RecvTimeoutError::Disconnected) => self.done = true,
                Err(RecvTimeoutError::Timeout) => {}
            }
        }
    }

    /// Reads and drops the rest of the input, so the answer comes after EOF whatever happened.
    pub fn drain(&mut self, stop: &Stop<'_>) -> Result<(), Halt> {
        while self.next(stop)?.is_some() {}
        Ok(())
    }

    /// A `Read` over the input; a halt surfaces as an `Interrupted`-kind error.
    pub fn reader<'a, 'b>(&'a mut self, stop: &'a Stop<'b>) -> InputReader<'a, 'b> {
        InputReader {
            input: self,
            stop,
            cur: Vec::new(),
            pos: 0,
        }
    }
}

pub struct InputReader<'a, 'b> {
    input: &'a mut Input,
    stop: &'a Stop<'b>,
    cur: Vec<u8>,
    pos: usize,
}

impl io::Read for InputReader<'_, '_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        while self.pos >= self.cur.len() {
            match self.input.next(self.stop) {
                Ok(Some(d)) => {
                    self.cur = d;
                    self.pos = 0;
                }
                Ok(None) => return Ok(0),
                Err(h) => return Err(io::Error::other(format!("{h:?}"))),
            }
        }
        let n = buf.len().min(self.cur.len() - self.pos);
        buf[..n].copy_from_slice(&self.cur[self.pos..self.pos + n]);
        self.pos += n;
        Ok(n)
    }
}
