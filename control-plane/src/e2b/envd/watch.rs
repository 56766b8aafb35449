//! A watch as envd's events: the watch itself, its events and the entries they carry, in
//! envd's words (shared by `WatchDir` and the polled watchers).

use futures::StreamExt;
use sandbox_protocol::files::{EntryType, FileEntry};
use serde::Deserialize;
use serde_json::{Value, json};

use super::super::connect::RpcError;
use super::super::refusal::Refusal;
use super::super::state::E2b;
use super::absolute;
use crate::api::{WatchEvent, WatchEventType};
use crate::ops::files::{Watch, Watching};
use crate::routes::files::fs_status;

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct WatchRequest {
    #[serde(default)]
    pub path: String,
    #[serde(default)]
    pub recursive: bool,
}

/// The watch of `req` ([`crate::ops::files::Watch`]): its events, `armed` first.
pub async fn watch(
    e: &E2b,
    id: &str,
    req: &WatchRequest,
) -> Result<impl futures::Stream<Item = Result<WatchEvent, RpcError>> + Send + 'static, RpcError> {
    let op = Watch::new(&absolute(&req.path), req.recursive)
        .map_err(|err| RpcError::from(Refusal::new(fs_status(err.code), err.message)))?;
    match e.apply(id, op).await? {
        Watching::Armed(events) => Ok(events.map(Ok)),
        Watching::Refused(err) => Err(Refusal::new(fs_status(err.code), err.message).into()),
    }
}

/// A native watch event as envd's `WatchDirResponse` (`armed` is its `start`); `None` for what
/// envd has no word for.
pub fn watch_message(ev: &WatchEvent, root: &str) -> Option<Value> {
    if ev.kind == WatchEventType::Armed {
        return Some(json!({ "start": {} }));
    }
    if ev.kind == WatchEventType::Overflow {
        return None;
    }
    filesystem_event(ev, root).map(|f| json!({ "filesystem": f }))
}

/// A native watch event as envd's `FilesystemEvent`: `name` relative to the watched directory.
pub fn filesystem_event(ev: &WatchEvent, root: &str) -> Option<Value> {
    let kind = match ev.kind {
        WatchEventType::Create => "EVENT_TYPE_CREATE",
        WatchEventType::Write => "EVENT_TYPE_WRITE",
        WatchEventType::Remove => "EVENT_TYPE_REMOVE",
        WatchEventType::Rename => "EVENT_TYPE_RENAME",
        WatchEventType::Chmod => "EVENT_TYPE_CHMOD",
        _ => return None,
    };
    let path = ev.path.as_deref().unwrap_or("");
    let name = path
        .strip_prefix(root.trim_end_matches('/'))
        .map(|r| r.trim_start_matches('/'))
        .unwrap_or(path);
    let mut v = json!({ "name": name, "type": kind });
    if let Some(entry) = &ev.entry {
        v["entry"] = entry_info(entry);
    }
    Some(v)
}

/// The sandbox user's name as E2B knows it: the Debian image gives uid and gid 1000 both
/// names, `sandbox` first (the native API's), `user` (E2B's templates').
fn e2b_name(name: &str) -> &str {
    if name == "sandbox" { "user" } else { name }
}

/// A native entry as envd's `EntryInfo` (proto3 JSON: int64 as a string, a timestamp in RFC 3339).
pub fn entry_info(e: &FileEntry) -> Value {
    let kind = match e.entry_type {
        EntryType::File => "FILE_TYPE_FILE",
        EntryType::Directory => "FILE_TYPE_DIRECTORY",
        EntryType::Symlink => "FILE_TYPE_SYMLINK",
        EntryType::Other => "FILE_TYPE_UNSPECIFIED",
    };
    let mtime = Some(crate::time::rfc3339(e.mtime))
        .filter(|t| !t.is_empty())
        .unwrap_or_else(|| "1970-01-01T00:00:00Z".to_string());
    let mut v = json!({
        "name": e.name,
        "type": kind,
        "path": e.path,
        "size": e.size.to_string(),
        "mode": e.mode,
        "permissions": e.permissions,
        "owner": e2b_name(&e.owner),
        "group": e2b_name(&e.group),
        "modifiedTime": mtime,
    });
    if let Some(t) = &e.symlink_target {
        v["symlinkTarget"] = json!(t);
        v["isSymlink"] = json!(true);
    }
    if !e.metadata.is_empty() {
        v["metadata"] = json!(e.metadata);
    }
    v
}
