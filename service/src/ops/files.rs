//! Raw files and watches anywhere the sandbox user may go, streamed through the session's
//! helper: what `GET`/`PUT /session/{id}/files`, `GET .../watch` and E2B's envd `/files` and
//! `WatchDir` all are. Each operation is built from what a door decoded (a path checked once,
//! here: [`ReadFile::new`], [`WriteFile::new`], [`Watch::new`]); an fs-level problem is an
//! [`FsError`] in the answer, which each door renders its own way.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// A multipart body bounded before a door's parser buffers it, as a seed's is (its preamble and
/// each part's headers at most 16 KiB, at most 64 parts): what E2B's and OpenSandbox's uploads
/// parse. The tripwire says which bound a failed body went over.
pub use crate::workspace::multipart::{Guarded as GuardedMultipart, Tripwire};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use sandbox_protocol::files::{FileAnswer, FsStatRequest, permission_bits, validate_any_path};
use sandbox_protocol::message::{ChangeKind, Event, Request};
use sandbox_protocol::wire::{FsError, FsErrorCode};
use tokio::sync::mpsc;

use super::{Access, Admit, Held, Op, Reached};
use crate::api::{WatchEvent, WatchEventType};
use crate::config::Config;
use crate::error::ApiError;
use crate::runtime::{FileRead, HelperError, WatchOpen};

pub use crate::runtime::FileStream;
pub use sandbox_protocol::message::ByteRange;

/// A file's bytes, or the range of them asked for, streamed as the helper reads them. Beside
/// the session's work: a download never holds up its commands. An fs slot, held with the
/// answer until the door has sent it.
pub struct ReadFile {
    path: String,
    range: Option<ByteRange>,
}

impl ReadFile {
    /// `path` checked (`invalid_path` otherwise).
    pub fn new(path: &str, range: Option<ByteRange>) -> Result<Self, FsError> {
        Ok(Self {
            path: validate_any_path(path)?,
            range,
        })
    }
}

/// What a [`ReadFile`] found.
pub enum Read {
    Stream(FileStream),
    /// Refused; for `invalid_range`, the file's size (a 416's `Content-Range: bytes */size`).
    Refused {
        error: FsError,
        size: Option<u64>,
    },
}

impl Op for ReadFile {
    type Output = Held<Read>;
    const ADMIT: Admit = Admit::Fs;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<Held<Read>, ApiError> {
        let ws = at.workspace();
        let answer = match ws.runtime.read_file(ws.id, &self.path, self.range).await? {
            FileRead::Stream(s) => Read::Stream(s),
            FileRead::Refused(error) if error.code == FsErrorCode::InvalidRange => {
                let stat = FsStatRequest { path: self.path };
                let found = crate::workspace::fs::Fs::new(&ws).stat(&stat).await.ok();
                let size = found.and_then(|a| a.entry).map(|e| e.size);
                Read::Refused { error, size }
            }
            FileRead::Refused(error) => Read::Refused { error, size: None },
        };
        Ok(Held {
            answer,
            hold: at.into_hold(),
        })
    }
}

/// A file written from a byte stream, in the session's order (an fs slot, then its lock),
/// bounded by `FILE_MAX_BYTES` whatever the body says of itself.
pub struct WriteFile {
    path: String,
    mode: Option<u32>,
    parents: bool,
    /// A temporary file renamed over the path (a reader sees the old file or the new one), or
    /// the file truncated and written in place (a watcher sees its own create and write).
    atomic: bool,
    /// The body's declared length, refused before anything is written when over the limit.
    declared: Option<u64>,
    /// The file's metadata (`user.e2b.*` attributes) afterwards, when the caller sets it.
    metadata: Option<std::collections::BTreeMap<String, String>>,
    body: BoxStream<'static, std::io::Result<Bytes>>,
}

impl WriteFile {
    /// `path` and `mode` checked (one mode rule: 0..=0o7777, its permission bits applied).
    pub fn new(
        path: &str,
        mode: Option<u32>,
        body: BoxStream<'static, std::io::Result<Bytes>>,
    ) -> Result<Self, FsError> {
        let path = validate_any_path(path)?;
        let mode = mode
            .map(permission_bits)
            .transpose()
            .map_err(|why| FsError::new(FsErrorCode::InvalidPath, why))?;
        Ok(Self {
            path,
            mode,
            parents: true,
            atomic: true,
            declared: None,
            metadata: None,
            body,
        })
    }

    /// The file's metadata once written: these keys and values, every other one removed
    /// (E2B's uploads: an upload without metadata clears what an earlier one left).
    pub fn metadata(self, metadata: std::collections::BTreeMap<String, String>) -> Self {
        Self {
            metadata: Some(metadata),
            ..self
        }
    }

    pub fn parents(self, parents: bool) -> Self {
        Self { parents, ..self }
    }

    pub fn atomic(self, atomic: bool) -> Self {
        Self { atomic, ..self }
    }

    pub fn declared(self, declared: Option<u64>) -> Self {
        Self { declared, ..self }
    }
}

/// What a [`WriteFile`] did: the file written (its size), or the fs-level refusal (`too_large`
/// when the body passed the limit: nothing was written).
pub enum Write {
    Written(FileAnswer),
    Refused(FsError),
}

fn too_large(max: u64) -> FsError {
    FsError::new(
        FsErrorCode::TooLarge,
        format!(
            "the body is over the {max}-byte limit (DAIV_SANDBOX_FILE_MAX_BYTES); nothing was written"
        ),
    )
}

impl Op for WriteFile {
    type Output = Write;
    const ADMIT: Admit = Admit::Fs;
    const ACCESS: Access = Access::Ordered;

    fn answer_early(&self, config: &Config) -> Option<Write> {
        let max = config.sessions.file_max_bytes;
        self.declared
            .is_some_and(|n| n > max)
            .then(|| Write::Refused(too_large(max)))
    }

    async fn apply(self, at: Reached) -> Result<Write, ApiError> {
        let ws = at.workspace();
        let max = ws.config.sessions.file_max_bytes;
        let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(4);
        let over = Arc::new(AtomicBool::new(false));
        let pump_over = over.clone();
        let mut body = self.body;
        let pump = tokio::spawn(async move {
            let mut total = 0u64;
            while let Some(chunk) = body.next().await {
                let stop = match &chunk {
                    Ok(c) => {
                        total += c.len() as u64;
                        // The chunk that passes the cap still goes: the helper sees the
                        // content is over `max_bytes`, removes its temporary file and answers
                        // `too_large` at the EOF that follows, once nothing is left.
                        let over = total > max;
                        if over {
                            pump_over.store(true, Ordering::Relaxed);
                        }
                        over
                    }
                    // The client's body broke: the write is abandoned (cancelled) in the helper.
                    Err(_) => true,
                };
                if tx.send(chunk).await.is_err() || stop {
                    return;
                }
            }
        });
        let request = Request::FileWrite {
            path: self.path,
            mode: self.mode,
            parents: self.parents,
            max_bytes: max,
            in_place: !self.atomic,
            metadata: self.metadata,
        };
        let r = ws.runtime.write_file(ws.id, request, rx).await;
        pump.abort();
        match r {
            Ok(FileAnswer { error: Some(e), .. }) => Ok(Write::Refused(e)),
            Ok(a) => Ok(Write::Written(a)),
            Err(_) if over.load(Ordering::Relaxed) => Ok(Write::Refused(too_large(max))),
            Err(HelperError::ArchiveRefused) => Err(ApiError::BadRequest(
                "the request body could not be read to its end; nothing was written".into(),
            )),
            Err(e) => Err(e.into()),
        }
    }
}

/// Most bytes of a file whose text [`ReplaceText`] replaces (the agent's `edit`'s bound).
pub const REPLACE_MAX_BYTES: u64 = sandbox_protocol::wire::EDIT_MAX_BYTES;

/// Every occurrence of a text in a file replaced by another (OpenSandbox's `/files/replace`),
/// counted as Go's `strings.ReplaceAll` finds them: left to right, none overlapping. Anywhere
/// the sandbox user may read and write, in the session's order (an fs slot, then its lock, held
/// from the read to the write): the file is read whole through the helper (at most
/// [`REPLACE_MAX_BYTES`]) and, when something was replaced, written back in place as the
/// sandbox user, its mode and owner kept. Bytes, not characters: a file need not be UTF-8.
pub struct ReplaceText {
    path: String,
    old: Vec<u8>,
    new: Vec<u8>,
}

impl ReplaceText {
    /// `path` checked (`invalid_path` otherwise); an empty `old` is `string_not_found` (there is
    /// nothing to find), as the agent's `edit` answers it.
    pub fn new(path: &str, old: &str, new: &str) -> Result<Self, FsError> {
        if old.is_empty() {
            return Err(FsError::new(
                FsErrorCode::StringNotFound,
                "old must not be empty: give the exact text to replace",
            ));
        }
        Ok(Self {
            path: validate_any_path(path)?,
            old: old.as_bytes().to_vec(),
            new: new.as_bytes().to_vec(),
        })
    }
}

/// What a [`ReplaceText`] did: how many occurrences it replaced (0: the file was left as it
/// was), or the fs-level refusal.
pub enum Replaced {
    Count(u64),
    Refused(FsError),
}

/// What [`replace_all`] makes of a file.
#[derive(Debug, PartialEq, Eq)]
enum Replacement {
    /// No occurrence.
    None,
    /// The text would pass `max` bytes: stopped there, nothing built past it.
    TooLarge,
    Text(Vec<u8>, u64),
}

/// `content` with every occurrence of `old` (not empty) replaced by `new`, and how many there
/// were. The result's length is counted before it is built, so a short file of many small
/// matches replaced by a long text costs no more memory than `max`.
fn replace_all(content: &[u8], old: &[u8], new: &[u8], max: u64) -> Replacement {
    let finder = memchr::memmem::Finder::new(old);
    // `find_iter` answers none that overlaps the one before it.
    let count = finder.find_iter(content).count() as u64;
    if count == 0 {
        return Replacement::None;
    }
    let len = (content.len() as u64 - count * old.len() as u64)
        .checked_add(count.saturating_mul(new.len() as u64));
    if len.is_none_or(|l| l > max) {
        return Replacement::TooLarge;
    }
    let mut out = Vec::with_capacity(usize::try_from(len.unwrap_or(0)).unwrap_or(0));
    let mut from = 0usize;
    for at in finder.find_iter(content) {
        out.extend_from_slice(&content[from..at]);
        out.extend_from_slice(new);
        from = at + old.len();
    }
    out.extend_from_slice(&content[from..]);
    Replacement::Text(out, count)
}

impl Op for ReplaceText {
    type Output = Replaced;
    const ADMIT: Admit = Admit::Fs;
    const ACCESS: Access = Access::Ordered;

    async fn apply(self, at: Reached) -> Result<Replaced, ApiError> {
        let ws = at.workspace();
        let too_large = |what: &str| {
            Replaced::Refused(FsError::new(
                FsErrorCode::TooLarge,
                format!(
                    "{}: {what} over the {REPLACE_MAX_BYTES}-byte limit of a replacement; \
                     nothing was written",
                    self.path
                ),
            ))
        };
        let stream = match ws.runtime.read_file(ws.id, &self.path, None).await? {
            FileRead::Stream(s) => s,
            FileRead::Refused(e) => return Ok(Replaced::Refused(e)),
        };
        if stream.size > REPLACE_MAX_BYTES {
            return Ok(too_large("the file is"));
        }
        let mut content = Vec::with_capacity(usize::try_from(stream.size).unwrap_or(0));
        let mut body = stream.body;
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| ApiError::Internal(e.into()))?;
            content.extend_from_slice(&chunk);
            // A file that grew while it was read is no less over the limit.
            if content.len() as u64 > REPLACE_MAX_BYTES {
                return Ok(too_large("the file is"));
            }
        }
        let max = ws.config.sessions.file_max_bytes.min(REPLACE_MAX_BYTES);
        // Refused before anything is written: an in-place write past its limit would leave the
        // file cut short.
        let (replaced, count) = match replace_all(&content, &self.old, &self.new, max) {
            Replacement::None => return Ok(Replaced::Count(0)),
            Replacement::TooLarge => return Ok(too_large("the replaced text is")),
            Replacement::Text(text, count) => (text, count),
        };
        let (tx, rx) = mpsc::channel::<std::io::Result<Bytes>>(1);
        // (The channel has room for the one chunk; dropping the sender is the content's end.)
        let _ = tx.try_send(Ok(Bytes::from(replaced)));
        drop(tx);
        let request = Request::FileWrite {
            path: self.path.clone(),
            mode: None,
            parents: false,
            max_bytes: max,
            in_place: true,
            metadata: None,
        };
        Ok(match ws.runtime.write_file(ws.id, request, rx).await? {
            FileAnswer { error: Some(e), .. } => Replaced::Refused(e),
            _ => Replaced::Count(count),
        })
    }
}

/// A directory's changes (`recursive`: everything below it too), beside the session's work:
/// armed when this answers; dropping the events ends the watch in the helper.
pub struct Watch {
    path: String,
    recursive: bool,
}

impl Watch {
    /// `path` checked (`invalid_path` otherwise).
    pub fn new(path: &str, recursive: bool) -> Result<Self, FsError> {
        Ok(Self {
            path: validate_any_path(path)?,
            recursive,
        })
    }
}

/// What a [`Watch`] found: its events, `armed` (with how many directories it watches) first,
/// then one per change and `overflow` where changes were lost (a client reading too slowly
/// included); they end when the watched directory goes. Or the fs-level refusal.
pub enum Watching {
    Armed(BoxStream<'static, WatchEvent>),
    Refused(FsError),
}

impl Op for Watch {
    type Output = Watching;
    const ADMIT: Admit = Admit::Free;
    const ACCESS: Access = Access::Beside;

    async fn apply(self, at: Reached) -> Result<Watching, ApiError> {
        let ws = at.workspace();
        let (watches, changes) = match ws.runtime.watch(ws.id, &self.path, self.recursive).await? {
            WatchOpen::Armed { watches, changes } => (watches, changes),
            WatchOpen::Refused(e) => return Ok(Watching::Refused(e)),
        };
        let armed = WatchEvent {
            watches: Some(watches),
            ..event(WatchEventType::Armed)
        };
        let changes = futures::stream::unfold(changes, |mut changes| async move {
            loop {
                if let Some(ev) = change(changes.recv().await?) {
                    return Some((ev, changes));
                }
            }
        });
        Ok(Watching::Armed(
            futures::stream::once(async { armed })
                .chain(changes)
                .boxed(),
        ))
    }
}

fn event(kind: WatchEventType) -> WatchEvent {
    WatchEvent {
        kind,
        path: None,
        entry: None,
        watches: None,
    }
}

/// A helper's change as the API's event; `None` for what is no change.
fn change(ev: Event) -> Option<WatchEvent> {
    match ev {
        Event::Change {
            change,
            path,
            entry,
        } => Some(WatchEvent {
            path: Some(path),
            entry: entry.map(|e| *e),
            ..event(match change {
                ChangeKind::Create => WatchEventType::Create,
                ChangeKind::Write => WatchEventType::Write,
                ChangeKind::Remove => WatchEventType::Remove,
                ChangeKind::Rename => WatchEventType::Rename,
                ChangeKind::Chmod => WatchEventType::Chmod,
            })
        }),
        Event::Overflow => Some(event(WatchEventType::Overflow)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replacement_counts_as_go_does_left_to_right_none_overlapping() {
        let max = 1 << 20;
        assert_eq!(
            replace_all(b"aaaa", b"aa", b"b", max),
            Replacement::Text(b"bb".to_vec(), 2)
        );
        assert_eq!(
            replace_all(b"xaaay", b"aa", b"<>", max),
            Replacement::Text(b"x<>ay".to_vec(), 1)
        );
        assert_eq!(
            replace_all(b"\xff host \xfe host", b"host", b"", max),
            Replacement::Text(b"\xff  \xfe ".to_vec(), 2)
        );
        assert_eq!(
            replace_all(b"nothing here", b"absent", b"x", max),
            Replacement::None
        );
    }

    #[test]
    fn a_replacement_past_the_limit_is_refused_before_it_is_built() {
        // 4 KiB of matches, each replaced by 1 KiB, would be 4 MiB: refused at a 1 MiB limit
        // (counted, never allocated).
        let content = vec![b'a'; 4096];
        let new = vec![b'x'; 1024];
        assert_eq!(
            replace_all(&content, b"a", &new, 1 << 20),
            Replacement::TooLarge
        );
        assert_eq!(
            replace_all(b"ab", b"a", b"xyz", 4),
            Replacement::Text(b"xyzb".to_vec(), 1)
        );
        assert_eq!(replace_all(b"ab", b"a", b"xyzw", 4), Replacement::TooLarge);
    }

    #[test]
    fn an_empty_text_to_replace_is_refused() {
        assert!(ReplaceText::new("/workspace/a", "", "x").is_err());
        assert!(ReplaceText::new("relative", "a", "x").is_err());
        assert!(ReplaceText::new("/workspace/a", "a", "").is_ok());
    }
}
