//! E2B's fork and snapshots over ours: a fork answers as creates do, a snapshot id is a
//! `templateID`, and deleting that template deletes the snapshot.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::StatusCode;
use axum::response::IntoResponse;
use serde_json::{Value, json};

use super::control::{
    Answer, ApiFailure, SandboxId, body, info, looks_like_snapshot, sandbox, template_not_found,
    template_of,
};
use super::state::{E2b, session_id};
use crate::ids::SnapshotId;
use crate::ops::snapshots::TakeSnapshot;

/// `POST /sandboxes/{id}/snapshots {name?}`: a snapshot of ours, usable as a `templateID`.
pub async fn snapshot(
    State(e): State<E2b>,
    SandboxId(id): SandboxId,
    raw_body: axum::body::Bytes,
) -> Answer {
    let req: Value = body(&raw_body)?;
    let op = TakeSnapshot {
        name: req.get("name").and_then(Value::as_str).map(str::to_string),
        ttl_seconds: None,
    };
    let s = e.ops.apply(&session_id(&id)?, op).await?;
    Ok((
        StatusCode::CREATED,
        Json(
            json!({ "snapshotID": s.snapshot_id, "names": s.name.into_iter().collect::<Vec<_>>() }),
        ),
    )
        .into_response())
}

/// `GET /snapshots` (`sandboxID` filters by source, `name` by the name it was given).
pub async fn snapshots(State(e): State<E2b>, RawQuery(q): RawQuery) -> Answer {
    let (mut source, mut name) = (None, None);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match &*k {
            "sandboxID" => source = Some(v.into_owned()),
            "name" => name = Some(v.into_owned()),
            _ => {}
        }
    }
    let out: Vec<Value> = e
        .ops
        .snapshots()
        .await?
        .iter()
        .filter(|s| {
            source
                .as_deref()
                .is_none_or(|src| s.source_session_id == src)
        })
        .filter(|s| name.is_none() || s.name == name)
        .map(|s| json!({ "snapshotID": s.snapshot_id, "names": s.name.iter().collect::<Vec<_>>() }))
        .collect();
    Ok(Json(out).into_response())
}

/// `DELETE /templates/{id}`: deletes a snapshot of ours (the only templates this API makes).
pub async fn delete_template(State(e): State<E2b>, Path(raw): Path<String>) -> Answer {
    if !looks_like_snapshot(&raw) {
        return Err(template_not_found(&raw));
    }
    let id = SnapshotId::parse(&raw).map_err(|_| template_not_found(&raw))?;
    e.ops.delete_snapshot(&id).await.map_err(|err| {
        if err.status() == StatusCode::NOT_FOUND {
            template_not_found(&raw)
        } else {
            ApiFailure::from(err)
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
    let fork = crate::api::ForkRequest {
        count: u32::try_from(count).unwrap_or(u32::MAX),
        environment: None,
        metadata: None,
        timeout_seconds: req.get("timeout").and_then(Value::as_u64),
        on_timeout: None,
    };
    let forked = e.ops.fork(&session_id(id)?, fork).await?;
    let template = template_of(&e, &source);
    let out: Vec<Value> = forked
        .iter()
        .map(|f| json!({ "sandbox": sandbox(&e, f, &template) }))
        .collect();
    Ok((StatusCode::CREATED, Json(out)).into_response())
}
