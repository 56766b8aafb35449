//! envd's `filesystem.Filesystem` service over the data plane's operations on paths anywhere
//! ([`crate::ops::fs`]: `stat`, `mkdir`, `move`, `list`) and the native watch, as the sandbox
//! user. `Remove` has no fs op outside `/workspace`: it is a `rm -rf` run as the user after a
//! `stat`, one operation under the session's lock ([`crate::ops::fs::RemoveTree`]).

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use futures::StreamExt;
use sandbox_protocol::files::{
    EntryType, FileEntry, FsListRequest, FsMkdirRequest, FsMoveRequest, FsStatRequest,
};
use sandbox_protocol::wire::{FsError, FsErrorCode};
use serde::Deserialize;
use serde_json::{Value, json};

use super::super::connect::{self, Code, RpcError};
use super::super::state::E2b;
use super::watch::{WatchRequest, entry_info, watch, watch_message};
use super::{absolute, caller, message, watchers};
use crate::ops::fs;

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

#[derive(Debug, Deserialize)]
struct ListRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: u32,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct WatcherId {
    #[serde(default)]
    watcher_id: String,
}

/// `POST /filesystem.Filesystem/{method}`.
pub async fn call(
    State(e): State<E2b>,
    Path(method): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let streaming = connect::is_streaming(&headers);
    let result = async {
        connect::check_codec(&headers)?;
        let who = caller(&e, &headers)?;
        let id = who.id.as_str();
        match method.as_str() {
            "Stat" => {
                let req: PathRequest = message(&headers, &body)?;
                let entry = followed(&e, id, stat(&e, id, &absolute(&req.path)).await?).await;
                Ok(connect::unary(json!({ "entry": entry_info(&entry) })))
            }
            "MakeDir" => {
                let req: PathRequest = message(&headers, &body)?;
                let path = absolute(&req.path);
                let mkdir = FsMkdirRequest {
                    path: path.clone(),
                    parents: true,
                };
                let made = e.apply(id, fs::Mkdir(mkdir)).await?;
                fs_error(made.error)?;
                if !made.created {
                    return Err(RpcError::new(
                        Code::AlreadyExists,
                        format!("directory {path} already exists"),
                    ));
                }
                let entry = stat(&e, id, &path).await?;
                Ok(connect::unary(json!({ "entry": entry_info(&entry) })))
            }
            "Move" => {
                let req: MoveRequest = message(&headers, &body)?;
                let (src, dst) = (absolute(&req.source), absolute(&req.destination));
                let request = FsMoveRequest {
                    source: src,
                    destination: dst.clone(),
                };
                let moved = e.apply(id, fs::Move(request)).await?;
                fs_error(moved.error)?;
                let entry = stat(&e, id, &dst).await?;
                Ok(connect::unary(json!({ "entry": entry_info(&entry) })))
            }
            "ListDir" => {
                let req: ListRequest = message(&headers, &body)?;
                let request = FsListRequest {
                    path: absolute(&req.path),
                    depth: req.depth.max(1),
                };
                let listed = e.apply(id, fs::List(request)).await?;
                fs_error(listed.error)?;
                let entries: Vec<Value> = listed.entries.iter().map(entry_info).collect();
                Ok(connect::unary(json!({ "entries": entries })))
            }
            "Remove" => {
                let req: PathRequest = message(&headers, &body)?;
                remove(&e, id, &absolute(&req.path)).await?;
                Ok(connect::unary(json!({})))
            }
            "WatchDir" => {
                let req: WatchRequest = message(&headers, &body)?;
                let events = watch(&e, id, &req).await?;
                let root = absolute(&req.path);
                let messages = events.filter_map(move |ev| {
                    let root = root.clone();
                    async move {
                        match ev {
                            Err(err) => Some(Err(err)),
                            Ok(ev) => watch_message(&ev, &root).map(Ok),
                        }
                    }
                });
                Ok(connect::stream(messages))
            }
            "CreateWatcher" => {
                let req: WatchRequest = message(&headers, &body)?;
                let watcher = watchers::create(&e, id, req).await?;
                Ok(connect::unary(json!({ "watcherId": watcher })))
            }
            "GetWatcherEvents" => {
                let req: WatcherId = message(&headers, &body)?;
                e.watchers.settle(id, &req.watcher_id).await?;
                let events = e.watchers.drain(id, &req.watcher_id)?;
                Ok(connect::unary(json!({ "events": events })))
            }
            "RemoveWatcher" => {
                let req: WatcherId = message(&headers, &body)?;
                e.watchers.remove(id, &req.watcher_id)?;
                Ok(connect::unary(json!({})))
            }
            other => Err(RpcError::new(
                Code::Unimplemented,
                format!("filesystem.Filesystem/{other} is not served"),
            )),
        }
    }
    .await;
    match result {
        Ok(r) => r,
        Err(err) if streaming => connect::stream_error(err),
        Err(err) => err.into_response(),
    }
}

/// An fs op's error as the Connect code the SDK expects (`not_found` → its `NotFoundException`).
fn fs_error(error: Option<FsError>) -> Result<(), RpcError> {
    let Some(err) = error else { return Ok(()) };
    let code = match err.code {
        FsErrorCode::NotFound => Code::NotFound,
        FsErrorCode::PermissionDenied => Code::PermissionDenied,
        FsErrorCode::AlreadyExists => Code::AlreadyExists,
        FsErrorCode::InvalidPath | FsErrorCode::NotADirectory | FsErrorCode::IsADirectory => {
            Code::InvalidArgument
        }
        _ => Code::FailedPrecondition,
    };
    Err(RpcError::new(code, err.message))
}

pub async fn stat(e: &E2b, id: &str, path: &str) -> Result<FileEntry, RpcError> {
    let request = FsStatRequest {
        path: path.to_string(),
    };
    let r = e.apply(id, fs::Stat(request)).await?;
    fs_error(r.error)?;
    r.entry
        .ok_or_else(|| RpcError::new(Code::NotFound, format!("{path} not found")))
}

/// A symlink's entry as envd's `Stat` gives it: the type of what it leads to and the absolute
/// path it resolves to (a dangling or looping link keeps its own entry).
async fn followed(e: &E2b, id: &str, link: FileEntry) -> FileEntry {
    let mut at = link.clone();
    for _ in 0..8 {
        let (EntryType::Symlink, Some(target)) = (at.entry_type, at.symlink_target.as_deref())
        else {
            if at.path == link.path {
                return link;
            }
            return FileEntry {
                entry_type: at.entry_type,
                symlink_target: Some(at.path),
                ..link
            };
        };
        let dir = at.path.rsplit_once('/').map_or("", |(d, _)| d);
        let next = lexical(&if target.starts_with('/') {
            target.to_string()
        } else {
            format!("{dir}/{target}")
        });
        match stat(e, id, &next).await {
            Ok(entry) => at = entry,
            Err(_) => return link,
        }
    }
    link
}

/// `path` with `.` and `..` components resolved by name.
fn lexical(path: &str) -> String {
    let mut parts: Vec<&str> = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            c => parts.push(c),
        }
    }
    format!("/{}", parts.join("/"))
}

/// Removes `path` and what is below it; a path that is not there is removed already (envd's
/// `Remove` does not fail on it).
async fn remove(e: &E2b, id: &str, path: &str) -> Result<(), RpcError> {
    let path = path.to_string();
    match e.apply(id, fs::RemoveTree { path: path.clone() }).await? {
        fs::Removal::Removed | fs::Removal::Absent => Ok(()),
        fs::Removal::Refused(err) => fs_error(Some(err)),
        fs::Removal::Failed(out) if out.contains("Permission denied") => Err(RpcError::new(
            Code::PermissionDenied,
            format!("cannot remove {path}: permission denied"),
        )),
        fs::Removal::Failed(out) => Err(RpcError::new(
            Code::Internal,
            format!("cannot remove {path}: {}", out.trim()),
        )),
    }
}
