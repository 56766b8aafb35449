//! The `fs/*` operations. Each returns its response with `error` set for anything about the
//! request's path or content (HTTP 200), or an [`FsOpError`] when the op could not be answered.
//!
//! Every op is one request to the session's helper over its channel (no Docker round trip): the
//! helper runs as the sandbox user, so the kernel enforces permissions, and it resolves paths
//! component by component beneath `/workspace`, so a symlink a command planted can neither lead
//! an op outside the workspace nor race it into a write as anyone but the sandbox user. Here,
//! requests are validated (paths lexically, content decoded) before they reach the session.
//! Each op records its duration and outcome (`fs_ops`; for `ls` and `glob`, until their
//! listing starts).
//!
//! `ls` and `glob` answer every entry, as the reference does: the helper finds them all (within
//! `FS_LIST_MAX_BYTES` of JSON, else `too_large`) before it sends the first, and they stream
//! through here a chunk at a time ([`Entries`]), so the service's memory does not depend on a
//! listing's size.

use std::future::Future;

use base64::Engine as _;
use bytes::Bytes;
use futures::StreamExt;
use futures::stream::BoxStream;
use sandbox_protocol::message::Request;
use serde::de::DeserializeOwned;

use super::validate_path;
use crate::config::Config;
use crate::runtime::{FS_DEADLINE, HelperError, Listing, SessionRuntime};
use crate::sessions::Workspace;
use crate::telemetry::metrics::{FsLabels, Metrics, observe_duration};
use sandbox_protocol::files::{
    FsListRequest, FsListResponse, FsMkdirRequest, FsMkdirResponse, FsMoveRequest, FsMoveResponse,
    FsStatRequest, FsStatResponse, LIST_MAX_DEPTH, permission_bits, validate_any_path,
};
use sandbox_protocol::wire::*;

pub use sandbox_protocol::wire::{
    EDIT_MAX_BYTES, EMPTY_FILE_SENTINEL, GREP_MAX_MATCHES, READ_MAX_BYTES, TRUNCATION_MARKER,
};

/// How an op failed: about the path or content ([`OpError::Fs`], `error` in a 200 response
/// with its wire `code`), or not answerable at all ([`OpError::Failed`], an HTTP error).
pub enum OpError {
    Fs(FsError),
    Failed(FsOpError),
}

/// Why an fs op got no answer: a request of the wrong shape, or the session's helper.
#[derive(Debug, thiserror::Error)]
pub enum FsOpError {
    /// [`sandbox_protocol::files::permission_bits`]'s refusal.
    #[error("{0}")]
    ModeOutOfRange(String),
    #[error("content is not valid base64: {0}")]
    InvalidBase64(#[source] base64::DecodeError),
    #[error(transparent)]
    Helper(#[from] HelperError),
}

impl From<FsOpError> for OpError {
    fn from(e: FsOpError) -> Self {
        OpError::Failed(e)
    }
}

impl From<HelperError> for OpError {
    fn from(e: HelperError) -> Self {
        OpError::Failed(e.into())
    }
}

fn fail(code: FsErrorCode, message: impl Into<String>) -> OpError {
    OpError::Fs(FsError::new(code, message))
}

/// Folds an op's outcome into its response type: fs errors into `error`, the rest passed up.
pub fn respond<T: Default>(
    r: Result<T, OpError>,
    with_error: impl FnOnce(&mut T, FsError),
) -> Result<T, FsOpError> {
    match r {
        Ok(v) => Ok(v),
        Err(OpError::Fs(e)) => {
            let mut v = T::default();
            with_error(&mut v, e);
            Ok(v)
        }
        Err(OpError::Failed(e)) => Err(e),
    }
}

/// An `ls` or `glob` answer as it streams from the helper: `count` entries, a chunk at a time,
/// in the listing's order, each checked to lie under the path asked for. The stream ends with an
/// error if the helper stopped early or broke the protocol; dropping it cancels the listing.
pub struct Entries {
    pub count: u64,
    pub chunks: BoxStream<'static, Result<Vec<FsEntry>, HelperError>>,
}

impl Entries {
    /// Every entry in one list (bounded by `FS_LIST_MAX_BYTES`), for front doors that answer a
    /// whole JSON value (MCP).
    pub async fn collect(mut self) -> Result<Vec<FsEntry>, HelperError> {
        let mut all = Vec::with_capacity(usize::try_from(self.count.min(65_536)).unwrap_or(0));
        while let Some(chunk) = self.chunks.next().await {
            all.extend(chunk?);
        }
        Ok(all)
    }
}

/// `chunks` with every entry checked to be below `path` (the helper names nothing else).
fn under(
    path: &str,
    chunks: BoxStream<'static, Result<Vec<FsEntry>, HelperError>>,
) -> BoxStream<'static, Result<Vec<FsEntry>, HelperError>> {
    let prefix = format!("{}/", path.trim_end_matches('/'));
    Box::pin(chunks.map(move |chunk| {
        let chunk = chunk?;
        if chunk.iter().all(|e| e.path.starts_with(&prefix)) {
            Ok(chunk)
        } else {
            tracing::warn!("session helper listed a path outside the one asked for");
            Err(HelperError::UnexpectedAnswer)
        }
    }))
}

fn path_arg(path: &str, allow_root: bool) -> Result<String, OpError> {
    validate_path(path, allow_root).map_err(|m| fail(FsErrorCode::InvalidPath, m))
}

/// The ops on one session's workspace.
pub struct Fs<'a> {
    runtime: &'a dyn SessionRuntime,
    config: &'a Config,
    metrics: &'a Metrics,
    id: &'a str,
}

impl<'a> Fs<'a> {
    /// The ops on the workspace `ws` (the caller made sure the session runs).
    pub fn new(ws: &Workspace<'a>) -> Self {
        Self {
            runtime: ws.runtime,
            config: ws.config,
            metrics: ws.metrics,
            id: ws.id,
        }
    }
}

impl Fs<'_> {
    /// `run`, timed and counted by its op and outcome (the fs code, or `api_error`).
    async fn observed<T>(
        &self,
        op: &'static str,
        run: impl Future<Output = Result<T, OpError>>,
    ) -> Result<T, OpError> {
        let started = std::time::Instant::now();
        let r = run.await;
        let code = match &r {
            Ok(_) => "ok".to_string(),
            Err(OpError::Fs(e)) => e.code.label(),
            Err(OpError::Failed(_)) => "api_error".to_string(),
        };
        let labels = FsLabels { op, code };
        observe_duration(
            &self.metrics.workspace.fs_ops.get_or_create(&labels),
            started.elapsed(),
        );
        r
    }

    /// One helper request, its answer parsed straight into the op's wire response; one whose
    /// `error` is set becomes [`OpError::Fs`] (so metrics see its code).
    async fn call<T: DeserializeOwned + HasError>(
        &self,
        request: Request,
        input: Option<Bytes>,
    ) -> Result<T, OpError> {
        let mut answer: T = self.runtime.fs(self.id, request, input).await?.parse()?;
        match answer.take_error() {
            Some(e) => Err(OpError::Fs(e)),
            None => Ok(answer),
        }
    }

    fn prunes(&self, exclude: Option<&[String]>) -> Vec<String> {
        let mut v = self.config.sessions.fs_prune_dirs.clone();
        v.extend(
            exclude
                .unwrap_or_default()
                .iter()
                .filter(|e| !e.is_empty())
                .cloned(),
        );
        v
    }

    /// An `ls` or `glob` on the helper: its entries streaming, or its fs error (`T` the op's
    /// wire response, `list` its entries when the helper answered them at once).
    async fn entries<T: DeserializeOwned + HasError>(
        &self,
        request: Request,
        path: &str,
        list: fn(T) -> Vec<FsEntry>,
    ) -> Result<Entries, OpError> {
        match self.runtime.listing(self.id, request).await? {
            Listing::Answer(a) => {
                let mut answer: T = a.parse()?;
                if let Some(e) = answer.take_error() {
                    return Err(OpError::Fs(e));
                }
                let entries = list(answer);
                Ok(Entries {
                    count: entries.len() as u64,
                    chunks: under(path, Box::pin(futures::stream::iter([Ok(entries)]))),
                })
            }
            Listing::Stream(s) => Ok(Entries {
                count: s.entries,
                chunks: under(path, s.chunks),
            }),
        }
    }

    /// One directory level, every entry, directories first then the rest, each sorted.
    pub async fn ls_entries(&self, req: &FsLsRequest) -> Result<Entries, OpError> {
        self.observed("ls", async {
            let path = path_arg(&req.path, true)?;
            let request = Request::Ls {
                path: path.clone(),
                max_bytes: self.config.sessions.fs_list_max_bytes,
                deadline_ms: deadline_ms(),
            };
            self.entries(request, &path, |r: FsLsResponse| r.entries)
                .await
        })
        .await
    }

    /// Every path under `path` matching the glob, sorted; pruned directories are never entered.
    pub async fn glob_entries(&self, req: &FsGlobRequest) -> Result<Entries, OpError> {
        self.observed("glob", async {
            let path = path_arg(&req.path, true)?;
            let request = Request::Glob {
                pattern: req.pattern.clone(),
                path: path.clone(),
                prune: self.prunes(req.exclude.as_deref()),
                max_bytes: self.config.sessions.fs_list_max_bytes,
                deadline_ms: deadline_ms(),
            };
            self.entries(request, &path, |r: FsGlobResponse| r.matches)
                .await
        })
        .await
    }

    /// [`Self::ls_entries`], collected.
    pub async fn ls(&self, req: &FsLsRequest) -> Result<FsLsResponse, OpError> {
        let entries = self.ls_entries(req).await?.collect().await?;
        Ok(FsLsResponse {
            entries,
            error: None,
        })
    }

    /// [`Self::glob_entries`], collected.
    pub async fn glob(&self, req: &FsGlobRequest) -> Result<FsGlobResponse, OpError> {
        let matches = self.glob_entries(req).await?.collect().await?;
        Ok(FsGlobResponse {
            matches,
            error: None,
        })
    }

    /// POSIX ERE search over regular files, stopping at the match cap.
    pub async fn grep(&self, req: &FsGrepRequest) -> Result<FsGrepResponse, OpError> {
        self.observed("grep", async {
            let path = path_arg(&req.path, true)?;
            let prune = self.prunes(req.exclude.as_deref());
            let glob = req.glob.clone().filter(|g| !g.is_empty());
            self.call(
                Request::Grep {
                    pattern: req.pattern.clone(),
                    path,
                    glob,
                    prune,
                    deadline_ms: deadline_ms(),
                },
                None,
            )
            .await
        })
        .await
    }

    /// A page of a file by lines (base64 for binary files).
    pub async fn read(&self, req: &FsReadRequest) -> Result<FsReadResponse, OpError> {
        self.observed("read", async {
            let path = path_arg(&req.path, false)?;
            self.call(
                Request::Read {
                    path,
                    offset: req.offset,
                    limit: req.limit.max(1),
                    deadline_ms: deadline_ms(),
                },
                None,
            )
            .await
        })
        .await
    }

    /// Create-only; missing parents are created as the sandbox user.
    pub async fn write(&self, req: &FsWriteRequest) -> Result<FsWriteResponse, OpError> {
        self.observed("write", async {
            // A mode out of range is the request's shape (422), whatever the path: checked first.
            let mode = permission_bits(req.mode).map_err(FsOpError::ModeOutOfRange)?;
            let path = path_arg(&req.path, false)?;
            let content = base64::engine::general_purpose::STANDARD
                .decode(req.content.as_bytes())
                .map_err(FsOpError::InvalidBase64)?;
            self.call(
                Request::Write {
                    path,
                    mode,
                    deadline_ms: deadline_ms(),
                },
                Some(Bytes::from(content)),
            )
            .await
        })
        .await
    }

    /// Replaces `old` by `new` (once, or every occurrence with `replace_all`).
    pub async fn edit(&self, req: &FsEditRequest) -> Result<FsEditResponse, OpError> {
        self.observed("edit", async {
            let path = path_arg(&req.path, false)?;
            if req.old.is_empty() {
                return Err(fail(
                    FsErrorCode::StringNotFound,
                    "old must not be empty: give the exact text to replace",
                ));
            }
            self.call(
                Request::Edit {
                    path,
                    old: req.old.clone(),
                    new: req.new.clone(),
                    replace_all: req.replace_all,
                    deadline_ms: deadline_ms(),
                },
                None,
            )
            .await
        })
        .await
    }

    /// Removes a file (or a symlink itself); directories are refused; absent = `removed: false`.
    pub async fn delete(&self, req: &FsDeleteRequest) -> Result<FsDeleteResponse, OpError> {
        self.observed("delete", async {
            let path = path_arg(&req.path, false)?;
            self.call(
                Request::Delete {
                    path,
                    deadline_ms: deadline_ms(),
                },
                None,
            )
            .await
        })
        .await
    }
}

/// The data plane's ops (ours, additive) on paths anywhere the sandbox user may go, not only
/// under `/workspace`: the kernel decides, as for every op.
impl Fs<'_> {
    /// A path's entry (a symlink's own, with its target).
    pub async fn stat(&self, req: &FsStatRequest) -> Result<FsStatResponse, OpError> {
        self.observed("stat", async {
            let path = validate_any_path(&req.path).map_err(OpError::Fs)?;
            self.call(
                Request::Stat {
                    path,
                    deadline_ms: deadline_ms(),
                },
                None,
            )
            .await
        })
        .await
    }

    /// A directory, with its missing parents when `parents` (then an existing one is no error).
    pub async fn mkdir(&self, req: &FsMkdirRequest) -> Result<FsMkdirResponse, OpError> {
        self.observed("mkdir", async {
            let path = validate_any_path(&req.path).map_err(OpError::Fs)?;
            self.call(
                Request::Mkdir {
                    path,
                    parents: req.parents,
                    deadline_ms: deadline_ms(),
                },
                None,
            )
            .await
        })
        .await
    }

    /// A rename, across directories of one filesystem.
    pub async fn move_entry(&self, req: &FsMoveRequest) -> Result<FsMoveResponse, OpError> {
        self.observed("move", async {
            let source = validate_any_path(&req.source).map_err(OpError::Fs)?;
            let destination = validate_any_path(&req.destination).map_err(OpError::Fs)?;
            self.call(
                Request::Move {
                    source,
                    destination,
                    deadline_ms: deadline_ms(),
                },
                None,
            )
            .await
        })
        .await
    }

    /// A directory's entries, `depth` levels down (at most [`LIST_MAX_DEPTH`]).
    pub async fn list(&self, req: &FsListRequest) -> Result<FsListResponse, OpError> {
        self.observed("list", async {
            let path = validate_any_path(&req.path).map_err(OpError::Fs)?;
            self.call(
                Request::List {
                    path,
                    depth: req.depth.clamp(1, LIST_MAX_DEPTH),
                    deadline_ms: deadline_ms(),
                },
                None,
            )
            .await
        })
        .await
    }
}

/// The helper's own deadline for an op.
fn deadline_ms() -> u64 {
    FS_DEADLINE.as_millis() as u64
}

/// A wire response's `error`, taken out (an answer with one is an fs-level problem).
trait HasError {
    fn take_error(&mut self) -> Option<FsError>;
}

macro_rules! has_error {
    ($($t:ty),*) => {$(
        impl HasError for $t {
            fn take_error(&mut self) -> Option<FsError> {
                self.error.take()
            }
        }
    )*};
}

has_error!(
    FsStatResponse,
    FsMkdirResponse,
    FsMoveResponse,
    FsListResponse,
    FsLsResponse,
    FsReadResponse,
    FsGrepResponse,
    FsGlobResponse,
    FsWriteResponse,
    FsEditResponse,
    FsDeleteResponse
);
