//! The `fs/*` operations. Each returns its response with `error` set for anything about the
//! request's path or content (HTTP 200), or an [`ApiError`] for session/transport trouble.
//!
//! Docker round trips per op, after the handler's one inspect (session lookup):
//! - `ls`, `glob`, `grep`, `delete`: one exec (create + start + inspect = 3).
//! - `read`: one `get_archive` (+1 per symlink followed).
//! - `write`: one exec (existence probe + parent creation as the sandbox user) + one
//!   `put_archive` = 4.
//! - `edit`: one `get_archive` (+1 per symlink followed) + one `put_archive` = 2.

use std::collections::HashSet;
use std::io::Read;

use base64::Engine as _;
use futures::TryStreamExt;
use tokio_util::io::{StreamReader, SyncIoBridge};

use super::wire::*;
use super::{exit, join_link, run_script, validate_path};
use crate::config::Config;
use crate::engine::{ContainerEngine, EngineError};
use crate::error::ApiError;

/// A single read response is capped at this many bytes (the reference's and deepagents' cap).
pub const READ_MAX_BYTES: usize = 512_000;
/// What an empty file reads as (deepagents' sentinel, which DAIV's client expects verbatim).
pub const EMPTY_FILE_SENTINEL: &str = "System reminder: File exists but has empty contents";
/// Appended to a text page cut at [`READ_MAX_BYTES`].
pub const TRUNCATION_MARKER: &str = "\n\n[... output truncated: this page exceeded the 512000-byte read limit. Continue reading from `end_line` (offset=end_line) or use a smaller limit.]";
/// Most matches one grep returns; more sets `truncated`.
pub const GREP_MAX_MATCHES: usize = 200;
/// Largest file `edit` rewrites: edits are read-modify-write in memory.
pub const EDIT_MAX_BYTES: u64 = 16 * 1024 * 1024;
/// Symlinks followed by `read`/`edit` before giving up (the kernel's ELOOP is 40; agents' repos
/// never need more than a few).
const MAX_LINK_HOPS: usize = 8;

/// An fs-level failure: becomes `error` in a 200 response; session trouble stays an ApiError.
pub enum OpError {
    Fs(FsError),
    Api(ApiError),
}

impl From<ApiError> for OpError {
    fn from(e: ApiError) -> Self {
        OpError::Api(e)
    }
}

impl From<EngineError> for OpError {
    fn from(e: EngineError) -> Self {
        OpError::Api(e.into())
    }
}

fn fail(code: FsErrorCode, message: impl Into<String>) -> OpError {
    OpError::Fs(FsError::new(code, message))
}

/// Folds an op's outcome into its response type: fs errors into `error`, the rest passed up.
pub fn respond<T: Default>(
    r: Result<T, OpError>,
    with_error: impl FnOnce(&mut T, FsError),
) -> Result<T, ApiError> {
    match r {
        Ok(v) => Ok(v),
        Err(OpError::Fs(e)) => {
            let mut v = T::default();
            with_error(&mut v, e);
            Ok(v)
        }
        Err(OpError::Api(e)) => Err(e),
    }
}

fn path_arg(path: &str, allow_root: bool) -> Result<String, OpError> {
    validate_path(path, allow_root).map_err(|m| fail(FsErrorCode::InvalidPath, m))
}

/// The context every op needs.
pub struct Fs<'a> {
    pub engine: &'a dyn ContainerEngine,
    pub config: &'a Config,
    pub id: &'a str,
}

/// Guards run before a directory op: sentinel exits for absent, not a directory, unreadable.
const GUARD_DIR: &str = r#"p=$1
[ -e "$p" ] || exit 7
[ -d "$p" ] || exit 8
{ [ -r "$p" ] && [ -x "$p" ]; } || exit 9
"#;

impl Fs<'_> {
    fn user(&self) -> String {
        format!("{}:{}", self.config.run_uid, self.config.run_gid)
    }

    fn guard_error(&self, code: i64, path: &str, dir_op: bool) -> Option<OpError> {
        match code {
            exit::ABSENT => Some(fail(
                FsErrorCode::NotFound,
                format!("{path} does not exist"),
            )),
            exit::WRONG_TYPE if dir_op => Some(fail(
                FsErrorCode::NotADirectory,
                format!("{path} is not a directory"),
            )),
            exit::WRONG_TYPE => Some(fail(
                FsErrorCode::IsADirectory,
                format!("{path} is a directory"),
            )),
            exit::DENIED => Some(fail(
                FsErrorCode::PermissionDenied,
                format!("permission denied: {path}"),
            )),
            _ => None,
        }
    }

    fn exec_failed(&self, what: &str, code: i64) -> OpError {
        fail(
            FsErrorCode::ExecFailed,
            format!("{what} failed unexpectedly (exit {code})"),
        )
    }

    // === ls ===

    /// One directory level, directories first then the rest, each sorted. NUL-separated, so
    /// any file name (newlines included) comes back intact.
    pub async fn ls(&self, req: &FsLsRequest) -> Result<FsLsResponse, OpError> {
        let path = path_arg(&req.path, true)?;
        let script = format!(
            "{GUARD_DIR}find \"$p/\" -mindepth 1 -maxdepth 1 -type d -print0 2>/dev/null; printf '\\0'; \
             find \"$p/\" -mindepth 1 -maxdepth 1 ! -type d -print0 2>/dev/null; exit 0"
        );
        let out = run_script(self.engine, self.id, &self.user(), &script, &[&path]).await?;
        if let Some(e) = self.guard_error(out.code, &path, true) {
            return Err(e);
        }
        if out.code != 0 {
            return Err(self.exec_failed("ls", out.code));
        }
        Ok(FsLsResponse {
            entries: split_typed(&out.stdout, &path),
            error: None,
        })
    }

    // === glob ===

    /// Paths under `path` matching the glob, relative to `path`; pruned directories are never
    /// entered. Sorted by path.
    pub async fn glob(&self, req: &FsGlobRequest) -> Result<FsGlobResponse, OpError> {
        let path = path_arg(&req.path, true)?;
        let pattern = req
            .pattern
            .trim_start_matches(&format!("{path}/"))
            .trim_start_matches('/');
        let matcher = globset::GlobBuilder::new(pattern)
            .literal_separator(true)
            .backslash_escape(true)
            .build()
            .map_err(|e| fail(FsErrorCode::InvalidPattern, format!("invalid glob: {e}")))?
            .compile_matcher();
        let prunes = self.prunes(req.exclude.as_deref());
        let (prune, args) = prune_expr(&path, &prunes, 2);
        let script = format!(
            "{GUARD_DIR}find \"$p/\" -mindepth 1 {prune} -type d -print0 2>/dev/null; printf '\\0'; \
             find \"$p/\" -mindepth 1 {prune} ! -type d -print0 2>/dev/null; exit 0"
        );
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_script(self.engine, self.id, &self.user(), &script, &refs).await?;
        if let Some(e) = self.guard_error(out.code, &path, true) {
            return Err(e);
        }
        if out.code != 0 {
            return Err(self.exec_failed("find", out.code));
        }
        let base = format!("{}/", path.trim_end_matches('/'));
        let mut matches: Vec<FsEntry> = split_typed(&out.stdout, &path)
            .into_iter()
            .filter(|e| {
                e.path
                    .strip_prefix(&base)
                    .is_some_and(|rel| matcher.is_match(rel))
            })
            .collect();
        matches.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(FsGlobResponse {
            matches,
            error: None,
        })
    }

    fn prunes(&self, exclude: Option<&[String]>) -> Vec<String> {
        let mut v = self.config.fs_prune_dirs.clone();
        v.extend(
            exclude
                .unwrap_or_default()
                .iter()
                .filter(|e| !e.is_empty())
                .cloned(),
        );
        v
    }

    // === grep ===

    /// POSIX ERE search. A directory is walked by a prune-aware `find` whose files go to
    /// `grep -HnE` through `xargs`; names containing `:` are listed first (NUL-separated) so the
    /// `path:line:text` output parses unambiguously. Files whose names contain a newline are not
    /// searched (grep's line-oriented output cannot carry them).
    pub async fn grep(&self, req: &FsGrepRequest) -> Result<FsGrepResponse, OpError> {
        let path = path_arg(&req.path, true)?;
        let glob = req.glob.as_deref().filter(|g| !g.is_empty());
        let basename_matcher = match glob {
            Some(g) => Some(
                globset::GlobBuilder::new(g)
                    .literal_separator(true)
                    .build()
                    .map_err(|e| fail(FsErrorCode::InvalidPattern, format!("invalid glob: {e}")))?
                    .compile_matcher(),
            ),
            None => None,
        };
        let prunes = self.prunes(req.exclude.as_deref());
        // $1 path, $2 pattern, $3 glob (or *), then prune names from $4.
        let (prune, mut args) = prune_expr(&path, &prunes, 4);
        args.insert(1, req.pattern.clone());
        args.insert(2, glob.unwrap_or("*").to_string());
        // The pattern is probed on one line of input: busybox compiles it only when it reads
        // a line, so an empty input would hide a bad pattern. Enough raw lines are kept to fill
        // the cap even when a few do not parse.
        let head = GREP_MAX_MATCHES * 2 + 1;
        let script = format!(
            r#"p=$1; pat=$2; g=$3
echo probe | grep -E -e "$pat" >/dev/null 2>&1; [ $? -ne 2 ] || exit 6
[ -e "$p" ] || exit 7
nl='
'
if [ -d "$p" ]; then
  {{ [ -r "$p" ] && [ -x "$p" ]; }} || exit 9
  find "$p/" -mindepth 1 {prune} -type f -name "$g" -name '*:*' ! -name "*$nl*" -print0 2>/dev/null
  printf '\0'
  find "$p/" -mindepth 1 {prune} -type f -name "$g" ! -name "*$nl*" -print0 2>/dev/null | xargs -0 -r grep -HnE -e "$pat" -- 2>/dev/null | head -n {head}
else
  [ -r "$p" ] || exit 9
  printf '%s\0\0' "$p"
  grep -HnE -e "$pat" -- "$p" 2>/dev/null | head -n {head}
fi
exit 0"#
        );
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        let out = run_script(self.engine, self.id, &self.user(), &script, &refs).await?;
        if out.code == exit::BAD_PATTERN {
            return Err(fail(
                FsErrorCode::InvalidPattern,
                format!("invalid regular expression (POSIX ERE): {:?}", req.pattern),
            ));
        }
        if let Some(e) = self.guard_error(out.code, &path, false) {
            return Err(e);
        }
        if out.code != 0 {
            return Err(self.exec_failed("grep", out.code));
        }
        let is_dir_search = !out.stdout.starts_with(format!("{path}\0\0").as_bytes());
        // (the single-file branch prints the file's own name as the only listed name)
        let mut matches = parse_grep(&out.stdout, &path);
        if !is_dir_search && let Some(m) = &basename_matcher {
            let base = path.rsplit('/').next().unwrap_or_default();
            if !m.is_match(base) {
                matches.clear();
            }
        }
        let truncated = matches.len() > GREP_MAX_MATCHES || out.cut;
        matches.truncate(GREP_MAX_MATCHES);
        Ok(FsGrepResponse {
            matches,
            truncated,
            error: None,
        })
    }

    // === read ===

    /// Streams the file out of the container and pages it without holding more than one page
    /// (plus the cap for a binary preview).
    pub async fn read(&self, req: &FsReadRequest) -> Result<FsReadResponse, OpError> {
        let path = path_arg(&req.path, false)?;
        let (offset, limit) = (req.offset, req.limit.max(1));
        let (_resolved, stream) = self.open(&path).await?;
        let (uid, gid) = (self.config.run_uid, self.config.run_gid);
        let shown = path.clone();
        let page = with_entry(stream, shown, (uid, gid), 0o4, move |entry, _| {
            page(entry, offset, limit).map_err(io_fail)
        })
        .await?;
        Ok(match page {
            Page::Empty => FsReadResponse {
                content: Some(EMPTY_FILE_SENTINEL.to_string()),
                encoding: Some("utf-8".into()),
                ..Default::default()
            },
            Page::Binary(bytes) => FsReadResponse {
                content: Some(base64::engine::general_purpose::STANDARD.encode(bytes)),
                encoding: Some("base64".into()),
                ..Default::default()
            },
            Page::BinaryTooLarge => {
                return Err(fail(
                    FsErrorCode::TooLarge,
                    format!("Binary file exceeds maximum preview size of {READ_MAX_BYTES} bytes"),
                ));
            }
            Page::OffsetBeyond { total } => {
                return Err(fail(
                    FsErrorCode::InvalidOffset,
                    format!("Line offset {offset} exceeds file length ({total} lines)"),
                ));
            }
            Page::Text {
                content,
                total_lines,
                end_line,
                truncated,
            } => FsReadResponse {
                content: Some(content),
                encoding: Some("utf-8".into()),
                total_lines: Some(total_lines),
                end_line: Some(end_line),
                truncated,
                error: None,
            },
        })
    }

    /// `get_archive` of a regular file, following symlinks (resolved lexically, as Docker does)
    /// so the README's "fs/read follows a symlink" holds. Returns the final path and a stream
    /// positioned at the start of the tar.
    async fn open(
        &self,
        path: &str,
    ) -> Result<
        (
            String,
            futures::stream::BoxStream<'static, Result<bytes::Bytes, EngineError>>,
        ),
        OpError,
    > {
        let mut current = path.to_string();
        for _ in 0..=MAX_LINK_HOPS {
            let stream = match self.engine.get_archive(self.id, &current).await {
                Ok(s) => s,
                Err(EngineError::NotFound) => {
                    return Err(fail(
                        FsErrorCode::NotFound,
                        format!("{path} does not exist"),
                    ));
                }
                Err(e) => return Err(e.into()),
            };
            // Peek at the first header (512 bytes, possibly preceded by long-name blocks).
            let mut peek = PeekedHead::new(stream);
            match peek.first_kind().await? {
                Head::File => return Ok((current, peek.into_stream())),
                Head::Dir => {
                    return Err(fail(
                        FsErrorCode::IsADirectory,
                        format!("{path} is a directory"),
                    ));
                }
                Head::Link(target) => current = join_link(&current, &target),
                Head::Other => {
                    return Err(fail(
                        FsErrorCode::ExecFailed,
                        format!("{path} is not a regular file"),
                    ));
                }
            }
        }
        Err(fail(
            FsErrorCode::ExecFailed,
            format!("{path}: too many levels of symbolic links"),
        ))
    }

    // === write ===

    /// Create-only. One exec as the sandbox user refuses an existing path, creates missing
    /// parents (owned by the sandbox user) and prints the parent's physical path; the file goes
    /// there through `put_archive` with the sandbox's uid/gid. Writing to the physical path of
    /// a directory the sandbox user may write grants nothing a command could not do.
    pub async fn write(&self, req: &FsWriteRequest) -> Result<FsWriteResponse, OpError> {
        let path = path_arg(&req.path, false)?;
        if req.mode > 0o7777 {
            return Err(OpError::Api(ApiError::Unprocessable(format!(
                "mode must be between 0 and 4095, got {}",
                req.mode
            ))));
        }
        let content = base64::engine::general_purpose::STANDARD
            .decode(req.content.as_bytes())
            .map_err(|e| {
                OpError::Api(ApiError::Unprocessable(format!(
                    "content is not valid base64: {e}"
                )))
            })?;
        let (parent, name) = path.rsplit_once('/').unwrap_or(("", &path));
        const SCRIPT: &str = r#"f=$1; d=$2
if [ -e "$f" ] || [ -L "$f" ]; then exit 10; fi
if [ ! -d "$d" ]; then
  err=$(mkdir -p -- "$d" 2>&1) || {
    case $err in *ermission*) exit 9;; *"ot a directory"*|*"ile exists"*) exit 11;; esac; exit 12; }
fi
{ [ -w "$d" ] && [ -x "$d" ]; } || exit 9
cd -P -- "$d" 2>/dev/null || exit 9
pwd -P"#;
        let out = run_script(self.engine, self.id, &self.user(), SCRIPT, &[&path, parent]).await?;
        match out.code {
            0 => {}
            exit::EXISTS => {
                return Err(fail(
                    FsErrorCode::AlreadyExists,
                    format!(
                        "Cannot write to {path} because it already exists. Read and then make an edit, or write to a new path."
                    ),
                ));
            }
            exit::DENIED => {
                return Err(fail(
                    FsErrorCode::PermissionDenied,
                    format!("permission denied: cannot create {path}"),
                ));
            }
            exit::PARENT_NOT_DIR => {
                return Err(fail(
                    FsErrorCode::NotADirectory,
                    format!("a parent of {path} is not a directory"),
                ));
            }
            code => return Err(self.exec_failed("write", code)),
        }
        let physical = String::from_utf8_lossy(&out.stdout)
            .trim_end_matches('\n')
            .to_string();
        if !physical.starts_with('/') {
            return Err(self.exec_failed("write", out.code));
        }
        self.put_file(&physical, name, &content, req.mode & 0o777)
            .await?;
        Ok(FsWriteResponse {
            ok: true,
            error: None,
        })
    }

    /// One `put_archive` of a single regular file owned by the sandbox user.
    async fn put_file(
        &self,
        dir: &str,
        name: &str,
        content: &[u8],
        mode: u32,
    ) -> Result<(), OpError> {
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Regular);
        h.set_mode(mode);
        h.set_uid(u64::from(self.config.run_uid));
        h.set_gid(u64::from(self.config.run_gid));
        h.set_size(content.len() as u64);
        h.set_mtime(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
        );
        let mut builder = tar::Builder::new(Vec::with_capacity(content.len() + 2048));
        builder.append_data(&mut h, name, content).map_err(|e| {
            fail(
                FsErrorCode::ExecFailed,
                format!("cannot archive {name}: {e}"),
            )
        })?;
        let tar = builder.into_inner().map_err(|e| {
            fail(
                FsErrorCode::ExecFailed,
                format!("cannot archive {name}: {e}"),
            )
        })?;
        let body =
            futures::StreamExt::boxed(futures::stream::once(
                async move { Ok(bytes::Bytes::from(tar)) },
            ));
        match self.engine.put_archive(self.id, dir, body).await {
            Ok(()) => Ok(()),
            Err(EngineError::NotFound) => Err(fail(
                FsErrorCode::NotFound,
                format!("{dir} no longer exists"),
            )),
            Err(EngineError::Rejected(m)) | Err(EngineError::Conflict(m)) => {
                Err(fail(FsErrorCode::PermissionDenied, m))
            }
            Err(e) => Err(e.into()),
        }
    }

    // === edit ===

    /// Read, replace, write back (following symlinks to the file they name). The file keeps its
    /// mode (special bits cleared) and becomes the sandbox user's. Refused unless its mode lets
    /// the sandbox user read and write it: the archive API itself runs as root.
    pub async fn edit(&self, req: &FsEditRequest) -> Result<FsEditResponse, OpError> {
        let path = path_arg(&req.path, false)?;
        if req.old.is_empty() {
            return Err(fail(
                FsErrorCode::StringNotFound,
                "old must not be empty: give the exact text to replace",
            ));
        }
        let (resolved, stream) = self.open(&path).await?;
        let (uid, gid) = (self.config.run_uid, self.config.run_gid);
        let shown = path.clone();
        let (raw, mode) = with_entry(stream, shown, (uid, gid), 0o6, |mut entry, shown| {
            if entry.size() > EDIT_MAX_BYTES {
                return Err(fail(
                    FsErrorCode::TooLarge,
                    format!("{shown} is larger than the {EDIT_MAX_BYTES}-byte edit limit"),
                ));
            }
            let mode = entry.header().mode().unwrap_or(0o644) & 0o777;
            let mut raw = Vec::with_capacity(entry.size() as usize);
            entry.read_to_end(&mut raw).map_err(io_fail)?;
            Ok((raw, mode))
        })
        .await?;
        let text = String::from_utf8(raw).map_err(|_| {
            fail(
                FsErrorCode::NotATextFile,
                format!("{path} is not a UTF-8 text file"),
            )
        })?;
        let (updated, count) = replace(&text, &req.old, &req.new, req.replace_all)?;
        let (dir, name) = resolved.rsplit_once('/').unwrap_or(("/", &resolved));
        let dir = if dir.is_empty() { "/" } else { dir };
        self.put_file(dir, name, updated.as_bytes(), mode).await?;
        Ok(FsEditResponse {
            occurrences: Some(count as u64),
            error: None,
        })
    }

    // === delete ===

    /// Removes a file (or a symlink itself, never its target); directories are refused.
    /// Idempotent: an absent path is `removed: false`.
    pub async fn delete(&self, req: &FsDeleteRequest) -> Result<FsDeleteResponse, OpError> {
        let path = path_arg(&req.path, false)?;
        const SCRIPT: &str = r#"f=$1
if [ -L "$f" ] || [ -e "$f" ]; then
  if [ -d "$f" ] && [ ! -L "$f" ]; then exit 8; fi
  err=$(rm -f -- "$f" 2>&1) && exit 0
  case $err in *ermission*|*ermitted*) exit 9;; esac; exit 12
fi
exit 7"#;
        let out = run_script(self.engine, self.id, &self.user(), SCRIPT, &[&path]).await?;
        match out.code {
            0 => Ok(FsDeleteResponse {
                ok: true,
                removed: true,
                error: None,
            }),
            exit::ABSENT => Ok(FsDeleteResponse {
                ok: true,
                removed: false,
                error: None,
            }),
            code => Err(self
                .guard_error(code, &path, false)
                .unwrap_or_else(|| self.exec_failed("rm", code))),
        }
    }
}

fn io_fail(e: std::io::Error) -> OpError {
    fail(
        FsErrorCode::ExecFailed,
        format!("reading the file failed: {e}"),
    )
}

/// The reader of a file's archive, bridged onto a blocking thread.
type ArchiveReader = SyncIoBridge<
    StreamReader<
        futures::stream::MapErr<
            futures::stream::BoxStream<'static, Result<bytes::Bytes, EngineError>>,
            fn(EngineError) -> std::io::Error,
        >,
        bytes::Bytes,
    >,
>;

/// Reads the single entry of a file's archive on a blocking thread (tar parsing is synchronous),
/// after checking the sandbox user's `want` permission bits on it, and hands it to `f` with the
/// path as shown to the caller.
async fn with_entry<T: Send + 'static>(
    stream: futures::stream::BoxStream<'static, Result<bytes::Bytes, EngineError>>,
    shown: String,
    (uid, gid): (u32, u32),
    want: u32,
    f: impl FnOnce(tar::Entry<'_, ArchiveReader>, &str) -> Result<T, OpError> + Send + 'static,
) -> Result<T, OpError> {
    fn to_io(e: EngineError) -> std::io::Error {
        std::io::Error::other(e.to_string())
    }
    tokio::task::spawn_blocking(move || {
        let to_io: fn(EngineError) -> std::io::Error = to_io;
        let reader = SyncIoBridge::new(StreamReader::new(stream.map_err(to_io)));
        let mut archive = tar::Archive::new(reader);
        let mut entries = archive.entries().map_err(io_fail)?;
        let Some(entry) = entries.next() else {
            return Err(fail(
                FsErrorCode::NotFound,
                format!("{shown} does not exist"),
            ));
        };
        let entry = entry.map_err(io_fail)?;
        check_access(&entry, uid, gid, want, &shown)?;
        f(entry, &shown)
    })
    .await
    .map_err(|e| ApiError::Internal(e.into()))?
}

/// The archive API runs as root; refuse what the sandbox user's permission bits would refuse
/// (`want`: 4 read, 2 write). Supplementary groups and ACLs are not considered.
fn check_access<R: Read>(
    entry: &tar::Entry<'_, R>,
    uid: u32,
    gid: u32,
    want: u32,
    path: &str,
) -> Result<(), OpError> {
    if uid == 0 {
        return Ok(());
    }
    let h = entry.header();
    let mode = h.mode().unwrap_or(0);
    let (fuid, fgid) = (h.uid().unwrap_or(0), h.gid().unwrap_or(0));
    let bits = if fuid == u64::from(uid) {
        mode >> 6
    } else if fgid == u64::from(gid) {
        mode >> 3
    } else {
        mode
    } & 0o7;
    if bits & want == want {
        Ok(())
    } else {
        Err(fail(
            FsErrorCode::PermissionDenied,
            format!("permission denied: {path}"),
        ))
    }
}

/// `find` prune fragment over positional parameters from `$first` on, and the argument list
/// (`path` first, then the names). Names are basename globs, as `find -name` takes them.
fn prune_expr(path: &str, prunes: &[String], first: usize) -> (String, Vec<String>) {
    let mut args = vec![path.to_string()];
    if prunes.is_empty() {
        return (String::new(), args);
    }
    let names: Vec<String> = (0..prunes.len())
        .map(|i| format!("-name \"${{{}}}\"", first + i))
        .collect();
    args.extend(prunes.iter().cloned());
    (
        format!("\\( -type d \\( {} \\) -prune \\) -o", names.join(" -o ")),
        args,
    )
}

/// Rebuilds a path `find` printed under `"$p/"` as `path/rel`, whatever slashes find used.
fn rebase(path: &str, found: &str) -> Option<String> {
    let rel = found.strip_prefix(path)?.trim_start_matches('/');
    if rel.is_empty() {
        return None;
    }
    Some(format!("{}/{rel}", path.trim_end_matches('/')))
}

/// Directories (NUL-separated), an empty record, then non-directories.
fn split_typed(out: &[u8], path: &str) -> Vec<FsEntry> {
    let mut entries = Vec::new();
    let mut dirs = true;
    let mut records = out.split(|b| *b == 0).peekable();
    while let Some(rec) = records.next() {
        if rec.is_empty() {
            if records.peek().is_none() {
                break;
            }
            dirs = false;
            continue;
        }
        let found = String::from_utf8_lossy(rec);
        if let Some(p) = rebase(path, &found) {
            entries.push(FsEntry {
                path: p,
                is_dir: dirs,
            });
        }
    }
    let (mut d, mut f): (Vec<_>, Vec<_>) = entries.into_iter().partition(|e| e.is_dir);
    d.sort_by(|a, b| a.path.cmp(&b.path));
    f.sort_by(|a, b| a.path.cmp(&b.path));
    d.extend(f);
    d
}

/// Parses `names-with-colons \0 ... \0\0 grep -Hn output`.
fn parse_grep(out: &[u8], path: &str) -> Vec<FsGrepMatch> {
    // Records up to the first empty one (names are never empty), then grep's output.
    let mut colon_paths: Vec<String> = Vec::new();
    let mut rest = out;
    while let Some(nul) = rest.iter().position(|b| *b == 0) {
        let record = &rest[..nul];
        rest = &rest[nul + 1..];
        if record.is_empty() {
            break;
        }
        colon_paths.push(String::from_utf8_lossy(record).into_owned());
    }
    let body = rest;
    colon_paths.sort_by_key(|p| std::cmp::Reverse(p.len()));
    let known: HashSet<&str> = colon_paths.iter().map(String::as_str).collect();
    let mut matches = Vec::new();
    for line in String::from_utf8_lossy(body).split('\n') {
        if line.is_empty() {
            continue;
        }
        let split = colon_paths
            .iter()
            .find_map(|p| {
                line.strip_prefix(p.as_str())?
                    .strip_prefix(':')
                    .map(|rest| (p.as_str(), rest))
            })
            .or_else(|| {
                let (p, rest) = line.split_once(':')?;
                (!known.contains(p)).then_some((p, rest))
            });
        let Some((file, rest)) = split else { continue };
        let Some((num, text)) = rest.split_once(':') else {
            continue;
        };
        let Ok(line_no) = num.parse::<u64>() else {
            continue;
        };
        let file = if file == path {
            file.to_string()
        } else {
            match rebase(path, file) {
                Some(p) => p,
                None => continue,
            }
        };
        matches.push(FsGrepMatch {
            path: file,
            line: line_no,
            text: text.strip_suffix('\r').unwrap_or(text).to_string(),
        });
    }
    matches
}

/// Exact-substring replacement, CRLF-aware: tries `old` as given, then with CRLF line endings,
/// then with LF. The error messages follow deepagents', which DAIV's client shows verbatim.
pub fn replace(
    text: &str,
    old: &str,
    new: &str,
    replace_all: bool,
) -> Result<(String, usize), OpError> {
    let old_lf = old.replace("\r\n", "\n");
    let new_lf = new.replace("\r\n", "\n");
    let old_crlf = old_lf.replace('\n', "\r\n");
    let new_crlf = new_lf.replace('\n', "\r\n");
    let candidates = [
        (old, new),
        (old_crlf.as_str(), new_crlf.as_str()),
        (old_lf.as_str(), new_lf.as_str()),
    ];
    let found = candidates.iter().find_map(|(o, n)| {
        let c = text.matches(o).count();
        (c > 0).then_some((*o, *n, c))
    });
    let Some((o, n, count)) = found else {
        let text_lf = text.replace("\r\n", "\n");
        if old_lf.len() > 1
            && let Some(stripped) = old_lf.strip_suffix('\n')
            && text_lf.ends_with(stripped)
        {
            let times = text_lf.matches(stripped).count();
            let msg = if times == 1 {
                "old_string ends with a newline, but the file does not end with a newline. Retry with the trailing newline removed from old_string (and from new_string if it also ends with a newline).".to_string()
            } else {
                format!(
                    "old_string ends with a newline, but the file does not end with a newline. With the trailing newline removed, old_string would appear {times} times in the file. Retry with the trailing newline removed and add surrounding context so the match is unique."
                )
            };
            return Err(fail(FsErrorCode::StringNotFound, msg));
        }
        return Err(fail(
            FsErrorCode::StringNotFound,
            "String not found in file: old must match the file's text exactly (whitespace and indentation included).",
        ));
    };
    if count > 1 && !replace_all {
        return Err(fail(
            FsErrorCode::MultipleOccurrences,
            format!(
                "String appears {count} times in file. Use replace_all=True to replace all instances, or provide a more specific string with surrounding context."
            ),
        ));
    }
    let updated = if replace_all {
        text.replace(o, n)
    } else {
        text.replacen(o, n, 1)
    };
    Ok((updated, count))
}

// === reading pages ===

#[derive(Debug, PartialEq)]
pub enum Page {
    Empty,
    Binary(Vec<u8>),
    BinaryTooLarge,
    OffsetBeyond {
        total: u64,
    },
    Text {
        content: String,
        total_lines: u64,
        end_line: u64,
        truncated: bool,
    },
}

/// Incremental UTF-8 validation across chunk boundaries.
struct Utf8Check {
    ok: bool,
    pending: Vec<u8>,
}

impl Utf8Check {
    fn feed(&mut self, mut chunk: &[u8]) {
        if !self.ok {
            return;
        }
        while !self.pending.is_empty() && !chunk.is_empty() {
            self.pending.push(chunk[0]);
            chunk = &chunk[1..];
            match std::str::from_utf8(&self.pending) {
                Ok(_) => self.pending.clear(),
                Err(e) if e.error_len().is_some() => {
                    self.ok = false;
                    return;
                }
                Err(_) => {}
            }
        }
        if !self.pending.is_empty() {
            return;
        }
        if let Err(e) = std::str::from_utf8(chunk) {
            if e.error_len().is_some() {
                self.ok = false;
            } else {
                self.pending = chunk[e.valid_up_to()..].to_vec();
            }
        }
    }

    fn valid(&self) -> bool {
        self.ok && self.pending.is_empty()
    }
}

/// Pages a file: lines `[offset, offset + limit)` (0-indexed), joined by `\n` (CR of CRLF
/// dropped), capped at [`READ_MAX_BYTES`] with [`TRUNCATION_MARKER`]. Memory: one page plus the
/// binary preview, whatever the file's size.
pub fn page(mut r: impl Read, offset: u64, limit: u64) -> std::io::Result<Page> {
    let mut buf = vec![0u8; 64 * 1024];
    let mut utf8 = Utf8Check {
        ok: true,
        pending: Vec::new(),
    };
    let mut size: u64 = 0;
    let mut prefix: Vec<u8> = Vec::new(); // first READ_MAX_BYTES + 1 bytes, for a binary preview
    let mut window: Vec<u8> = Vec::new(); // raw bytes of the requested lines
    let mut overflow = false;
    let mut line: u64 = 0; // index of the line being read
    let mut last_byte = b'\n';
    let end = offset.saturating_add(limit);
    loop {
        let n = r.read(&mut buf)?;
        if n == 0 {
            break;
        }
        let chunk = &buf[..n];
        utf8.feed(chunk);
        size += n as u64;
        if prefix.len() <= READ_MAX_BYTES {
            let take = (READ_MAX_BYTES + 1 - prefix.len()).min(n);
            prefix.extend_from_slice(&chunk[..take]);
        }
        let mut start = 0;
        for (i, b) in chunk.iter().enumerate() {
            if *b == b'\n' {
                if line >= offset && line < end && !overflow {
                    push_capped(&mut window, &chunk[start..=i], &mut overflow);
                }
                line += 1;
                start = i + 1;
            }
        }
        if start < n && line >= offset && line < end && !overflow {
            push_capped(&mut window, &chunk[start..], &mut overflow);
        }
        last_byte = chunk[n - 1];
    }
    if size == 0 {
        return Ok(Page::Empty);
    }
    if !utf8.valid() {
        if size > READ_MAX_BYTES as u64 {
            return Ok(Page::BinaryTooLarge);
        }
        return Ok(Page::Binary(prefix));
    }
    let total = line + u64::from(last_byte != b'\n');
    if offset >= total {
        return Ok(Page::OffsetBeyond { total });
    }
    // `window` is valid UTF-8 except possibly a character cut by the raw cap at its end.
    let valid = match std::str::from_utf8(&window) {
        Ok(s) => s,
        Err(e) => std::str::from_utf8(&window[..e.valid_up_to()]).unwrap_or_default(),
    };
    let mut lines: Vec<&str> = valid.split('\n').collect();
    // A trailing newline leaves an empty last piece that is not a line.
    let last_complete = if valid.ends_with('\n') {
        lines.pop();
        true
    } else {
        // Complete if the file ended there (not cut by the cap).
        !overflow
    };
    let lines: Vec<&str> = lines
        .iter()
        .map(|l| l.strip_suffix('\r').unwrap_or(l))
        .collect();
    let content = lines.join("\n");
    let complete_count = if last_complete {
        lines.len()
    } else {
        lines.len().saturating_sub(1)
    };
    if content.len() <= READ_MAX_BYTES && !overflow {
        return Ok(Page::Text {
            content,
            total_lines: total,
            end_line: offset + lines.len() as u64,
            truncated: false,
        });
    }
    let mut cut = READ_MAX_BYTES
        .saturating_sub(TRUNCATION_MARKER.len())
        .min(content.len());
    while !content.is_char_boundary(cut) {
        cut -= 1;
    }
    // Lines whose whole text lies before the cut are complete.
    let mut pos = 0usize;
    let mut complete = 0u64;
    for (i, l) in lines.iter().enumerate().take(complete_count) {
        pos += l.len();
        if pos > cut {
            break;
        }
        complete = i as u64 + 1;
        pos += 1;
    }
    let mut out = content[..cut].to_string();
    out.push_str(TRUNCATION_MARKER);
    Ok(Page::Text {
        content: out,
        total_lines: total,
        end_line: offset + complete,
        truncated: true,
    })
}

fn push_capped(window: &mut Vec<u8>, data: &[u8], overflow: &mut bool) {
    let room = (READ_MAX_BYTES + 1).saturating_sub(window.len());
    if data.len() > room {
        window.extend_from_slice(&data[..room]);
        *overflow = true;
    } else {
        window.extend_from_slice(data);
    }
}

// === peeking at the first tar header ===

enum Head {
    File,
    Dir,
    Link(String),
    Other,
}

/// Buffers the start of a `get_archive` stream until the first member's header is known, then
/// hands back the whole stream (buffered part first).
struct PeekedHead {
    stream: futures::stream::BoxStream<'static, Result<bytes::Bytes, EngineError>>,
    buf: Vec<u8>,
}

impl PeekedHead {
    fn new(stream: futures::stream::BoxStream<'static, Result<bytes::Bytes, EngineError>>) -> Self {
        Self {
            stream,
            buf: Vec::new(),
        }
    }

    async fn first_kind(&mut self) -> Result<Head, OpError> {
        use futures::StreamExt;
        // Long names and PAX headers precede the real header; 64 KiB covers any sane one.
        loop {
            let mut archive = tar::Archive::new(&self.buf[..]);
            if let Ok(mut entries) = archive.entries()
                && let Some(Ok(entry)) = entries.next()
            {
                let t = entry.header().entry_type();
                return Ok(match t {
                    tar::EntryType::Regular | tar::EntryType::Continuous => Head::File,
                    tar::EntryType::Directory => Head::Dir,
                    tar::EntryType::Symlink => Head::Link(
                        entry
                            .link_name_bytes()
                            .map(|l| String::from_utf8_lossy(&l).into_owned())
                            .unwrap_or_default(),
                    ),
                    _ => Head::Other,
                });
            }
            if self.buf.len() > 64 * 1024 {
                return Err(fail(FsErrorCode::ExecFailed, "unreadable archive header"));
            }
            match self.stream.next().await {
                Some(Ok(chunk)) => self.buf.extend_from_slice(&chunk),
                Some(Err(e)) => return Err(e.into()),
                None => {
                    return Err(fail(
                        FsErrorCode::NotFound,
                        "the path vanished while reading",
                    ));
                }
            }
        }
    }

    fn into_stream(self) -> futures::stream::BoxStream<'static, Result<bytes::Bytes, EngineError>> {
        use futures::StreamExt;
        let head = bytes::Bytes::from(self.buf);
        futures::stream::once(async move { Ok(head) })
            .chain(self.stream)
            .boxed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(p: Page) -> (String, u64, u64, bool) {
        match p {
            Page::Text {
                content,
                total_lines,
                end_line,
                truncated,
            } => (content, total_lines, end_line, truncated),
            other => panic!("not text: {other:?}"),
        }
    }

    #[test]
    fn pages_by_line_with_totals() -> std::io::Result<()> {
        let f = b"a\nb\nc\nd\n";
        assert_eq!(
            text(page(&f[..], 0, 2000)?),
            ("a\nb\nc\nd".into(), 4, 4, false)
        );
        assert_eq!(text(page(&f[..], 1, 2)?), ("b\nc".into(), 4, 3, false));
        assert_eq!(
            text(page(&b"x\r\ny"[..], 0, 10)?),
            ("x\ny".into(), 2, 2, false)
        );
        assert_eq!(page(&f[..], 4, 1)?, Page::OffsetBeyond { total: 4 });
        assert_eq!(page(&b""[..], 5, 1)?, Page::Empty);
        Ok(())
    }

    #[test]
    fn binary_is_detected_and_capped() -> std::io::Result<()> {
        assert_eq!(
            page(&b"\xff\x00ab"[..], 0, 10)?,
            Page::Binary(b"\xff\x00ab".to_vec())
        );
        let big = vec![0xffu8; READ_MAX_BYTES + 1];
        assert_eq!(page(&big[..], 0, 10)?, Page::BinaryTooLarge);
        Ok(())
    }

    #[test]
    fn long_pages_are_cut_with_a_marker_and_end_line() -> std::io::Result<()> {
        let line = "x".repeat(1000);
        let file = format!("{line}\n").repeat(1000);
        let (content, total, end, truncated) = text(page(file.as_bytes(), 0, 2000)?);
        assert!(truncated);
        assert!(content.len() <= READ_MAX_BYTES);
        assert!(content.ends_with(TRUNCATION_MARKER));
        assert_eq!(total, 1000);
        assert_eq!(
            end,
            ((READ_MAX_BYTES - TRUNCATION_MARKER.len()) / 1001) as u64
        );
        // One line longer than the cap: no complete line at all.
        let huge = "y".repeat(READ_MAX_BYTES * 2);
        let (_, total, end, truncated) = text(page(huge.as_bytes(), 0, 10)?);
        assert_eq!((total, end, truncated), (1, 0, true));
        Ok(())
    }

    #[test]
    fn utf8_split_across_chunks_is_still_text() {
        let mut c = Utf8Check {
            ok: true,
            pending: Vec::new(),
        };
        let s = "héllo".as_bytes();
        c.feed(&s[..2]);
        c.feed(&s[2..]);
        assert!(c.valid());
    }

    #[test]
    fn edit_rules() {
        let ok = |r: Result<(String, usize), OpError>| match r {
            Ok(v) => v,
            Err(OpError::Fs(e)) => panic!("{e:?}"),
            Err(OpError::Api(e)) => panic!("{e}"),
        };
        let code = |r: Result<(String, usize), OpError>| match r {
            Err(OpError::Fs(e)) => (e.code, e.message),
            _ => panic!("expected an fs error"),
        };
        assert_eq!(ok(replace("a b a", "b", "c", false)), ("a c a".into(), 1));
        assert_eq!(ok(replace("a b a", "a", "c", true)), ("c b c".into(), 2));
        assert_eq!(
            code(replace("a b a", "a", "c", false)).0,
            FsErrorCode::MultipleOccurrences
        );
        assert_eq!(
            code(replace("abc", "x", "y", false)).0,
            FsErrorCode::StringNotFound
        );
        assert_eq!(
            ok(replace("l1\r\nl2\r\n", "l1\nl2", "m1\nm2", false)),
            ("m1\r\nm2\r\n".into(), 1)
        );
        let (c, msg) = code(replace("end", "end\n", "x", false));
        assert_eq!(c, FsErrorCode::StringNotFound);
        assert!(msg.contains("trailing newline"), "{msg}");
    }

    #[test]
    fn grep_output_with_colons_in_names_parses() {
        let out = b"/w/a:1:b\0\0/w/a:1:b:3:hit: yes\n/w/plain:10:x:y\n";
        let m = parse_grep(out, "/w");
        assert_eq!(m.len(), 2);
        assert_eq!(
            (m[0].path.as_str(), m[0].line, m[0].text.as_str()),
            ("/w/a:1:b", 3, "hit: yes")
        );
        assert_eq!(
            (m[1].path.as_str(), m[1].line, m[1].text.as_str()),
            ("/w/plain", 10, "x:y")
        );
    }

    #[test]
    fn typed_listing_survives_newlines_in_names() {
        let out = b"/w/d\0/w/e\0\0/w/f\nwith newline\0/w/g\0";
        let e = split_typed(out, "/w");
        assert_eq!(e.len(), 4);
        assert!(e[0].is_dir && e[1].is_dir && !e[2].is_dir);
        assert_eq!(e[2].path, "/w/f\nwith newline");
    }
}
