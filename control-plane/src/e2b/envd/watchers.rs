//! envd's polled watchers: each a native watch read by a task into its buffer in
//! [`super::super::polled`], answered once the watch is armed.

use std::sync::{Arc, Mutex};

use futures::StreamExt;

use super::super::connect::{Code, RpcError};
use super::super::polled::{Buffer, lock};
use super::super::state::E2b;
use super::absolute;
use super::watch::{WatchRequest, filesystem_event, watch};
use crate::api::WatchEventType;

/// Starts a watcher on sandbox `id`; answers once the watch is armed (no event after is lost).
pub async fn create(e: &E2b, id: &str, req: WatchRequest) -> Result<String, RpcError> {
    let root = absolute(&req.path);
    let mut events = Box::pin(watch(e, id, &req).await?);
    match events.next().await {
        Some(Ok(ev)) if ev.kind == WatchEventType::Armed => {}
        Some(Err(err)) => return Err(err),
        _ => return Err(RpcError::new(Code::Internal, "the watch did not arm")),
    }
    let buffer = Arc::new(Mutex::new(Buffer::default()));
    let filler = buffer.clone();
    let task = tokio::spawn(async move {
        while let Some(ev) = events.next().await {
            let mut b = lock(&filler);
            match ev {
                Ok(ev) if ev.kind == WatchEventType::Overflow => b.overflow(),
                Ok(ev) => {
                    if let Some(v) = filesystem_event(&ev, &root) {
                        b.push(&v);
                    }
                }
                Err(err) => {
                    b.end(err);
                    return;
                }
            }
        }
        lock(&filler).end(RpcError::new(
            Code::NotFound,
            "the watch ended (the directory or the sandbox is gone)",
        ));
    });
    e.watchers
        .insert(id, buffer, task.abort_handle())
        .inspect_err(|_| task.abort())
}
