//! The `fs/*` operations. Each returns its response with `error` set for anything about the
//! request's path or content (HTTP 200), or an [`FsOpError`] when the op could not be answered.
//!
//! Every op is one request to the session's helper over its channel (no Docker round trip): the
//! helper runs as the sandbox user, so the kernel enforces permissions, and it resolves paths
//! component by component beneath `/workspace`, so a symlink a command planted can neither lead
//! an op outside the workspace nor race it into a write as anyone but the sandbox user. Here,
//! requests are validated (paths lexically, content decoded) before they reach the session.
//! Each op records its duration and outcome (`fs_ops`).

use std::future::Future;

use base64::Engine as _;
use bytes::Bytes;
use sandbox_protocol::message::Request;
use serde::de::DeserializeOwned;

use super::validate_path;
use super::wire::*;
use crate::config::Config;
use crate::runtime::{FS_DEADLINE, HelperError, SessionRuntime};
use crate::sessions::Workspace;
use crate::telemetry::metrics::{FsLabels, Metrics, observe_duration};

pub use super::wire::{
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
    #[error("mode must be between 0 and 4095, got {0}")]
    ModeOutOfRange(u32),
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

    /// One directory level, directories first then the rest, each sorted.
    pub async fn ls(&self, req: &FsLsRequest) -> Result<FsLsResponse, OpError> {
        self.observed("ls", async {
            let path = path_arg(&req.path, true)?;
            self.call(
                Request::Ls {
                    path,
                    deadline_ms: deadline_ms(),
                },
                None,
            )
            .await
        })
        .await
    }

    /// Paths under `path` matching the glob; pruned directories are never entered.
    pub async fn glob(&self, req: &FsGlobRequest) -> Result<FsGlobResponse, OpError> {
        self.observed("glob", async {
            let path = path_arg(&req.path, true)?;
            let prune = self.prunes(req.exclude.as_deref());
            self.call(
                Request::Glob {
                    pattern: req.pattern.clone(),
                    path,
                    prune,
                    deadline_ms: deadline_ms(),
                },
                None,
            )
            .await
        })
        .await
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
            if req.mode > 0o7777 {
                return Err(FsOpError::ModeOutOfRange(req.mode).into());
            }
            let path = path_arg(&req.path, false)?;
            let content = base64::engine::general_purpose::STANDARD
                .decode(req.content.as_bytes())
                .map_err(FsOpError::InvalidBase64)?;
            self.call(
                Request::Write {
                    path,
                    mode: req.mode & 0o777,
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
    FsLsResponse,
    FsReadResponse,
    FsGrepResponse,
    FsGlobResponse,
    FsWriteResponse,
    FsEditResponse,
    FsDeleteResponse
);
