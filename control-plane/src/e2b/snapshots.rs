//! E2B's fork and snapshots over ours: a fork answers as creates do, a snapshot id is a
//! `templateID`, and deleting that template deletes the snapshot.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{Method, StatusCode};
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::control::{
    Answer, ApiFailure, SandboxId, body, info, looks_like_snapshot, sandbox, template_not_found,
    template_of,
};
use super::state::E2b;
use crate::api::{SnapshotCreated, SnapshotList};

/// `POST /sandboxes/{id}/snapshots {name?}`: a snapshot of ours, usable as a `templateID`.
pub async fn snapshot(
    State(e): State<E2b>,
    SandboxId(id): SandboxId,
    raw_body: axum::body::Bytes,
) -> Answer {
    let id = id.as_str();
    let req: Value = body(&raw_body)?;
    let mut native = json!({});
    if let Some(name) = req.get("name").and_then(Value::as_str) {
        native["name"] = json!(name);
    }
    let s: SnapshotCreated = e
        .native
        .json(
            Method::POST,
            &format!("/session/{id}/snapshot/"),
            Some(&native),
            None,
        )
        .await?;
    Ok((
        StatusCode::CREATED,
        Json(
            json!({ "snapshotID": s.snapshot_id, "names": s.name.into_iter().collect::<Vec<_>>() }),
        ),
    )
        .into_response())
}

/// `GET /snapshots` (`sandboxID` filters by source).
pub async fn snapshots(State(e): State<E2b>, RawQuery(q): RawQuery) -> Answer {
    let source = form_urlencoded::parse(q.unwrap_or_default().as_bytes())
        .find(|(k, _)| k == "sandboxID")
        .map(|(_, v)| v.into_owned());
    let list: SnapshotList = e
        .native
        .json(Method::GET, "/snapshots/", None, None)
        .await?;
    let out: Vec<Value> = list
        .snapshots
        .iter()
        .filter(|s| {
            source
                .as_deref()
                .is_none_or(|src| s.source_session_id == src)
        })
        .map(|s| json!({ "snapshotID": s.snapshot_id, "names": s.name.iter().collect::<Vec<_>>() }))
        .collect();
    Ok(Json(out).into_response())
}

/// `DELETE /templates/{id}`: deletes a snapshot of ours (the only templates this API makes).
pub async fn delete_template(State(e): State<E2b>, Path(raw): Path<String>) -> Answer {
    if !looks_like_snapshot(&raw) {
        return Err(template_not_found(&raw));
    }
    let _: Value = e
        .native
        .json(Method::DELETE, &format!("/snapshots/{raw}/"), None, None)
        .await
        .map_err(|r| {
            if r.status == StatusCode::NOT_FOUND {
                template_not_found(&raw)
            } else {
                ApiFailure(r)
            }
        })?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /sandboxes/{id}/fork {timeout?, count?}`: 201 and `[{"sandbox": ...}]`, one per fork.
pub async fn fork(
    State(e): State<E2b>,
    SandboxId(id): SandboxId,
    raw_body: axum::body::Bytes,
) -> Answer {
    let id = id.as_str();
    let req: Value = body(&raw_body)?;
    let source = info(&e, id).await?;
    let count = req.get("count").and_then(Value::as_u64).unwrap_or(1);
    let mut native = json!({ "count": count });
    if let Some(t) = req.get("timeout").and_then(Value::as_u64) {
        native["timeout_seconds"] = json!(t);
    }
    let forked: crate::api::ForkResponse = e
        .native
        .json(
            Method::POST,
            &format!("/session/{id}/fork/"),
            Some(&native),
            None,
        )
        .await?;
    let template = template_of(&e, &source);
    let out: Vec<Value> = forked
        .session_ids
        .iter()
        .map(|f| json!({ "sandbox": sandbox(&e, f, &template) }))
        .collect();
    Ok((StatusCode::CREATED, Json(out)).into_response())
}
