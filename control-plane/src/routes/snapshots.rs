//! Snapshots, forks and pause: `/session/{id}/snapshot/`, `/session/{id}/fork/`,
//! `/session/{id}/pause/` and `/snapshots/...`.

use std::sync::Arc;

use axum::Json;
use axum::extract::{Path, State};
use axum::http::StatusCode;

use crate::admission::Admission;
use crate::api::{
    ForkRequest, ForkResponse, SnapshotCreated, SnapshotInfo, SnapshotList, SnapshotRequest,
};
use crate::error::{ApiError, ApiJson, ErrorBody};
use crate::fleet::Fleet;
use crate::snapshots::Snapshot;

/// Snapshot a session: its whole filesystem (container changes and workspace) at one instant.
/// The session is frozen only while its container is committed and its workspace copied;
/// running processes are not kept. Egress secrets and policy are never part of a snapshot.
///
/// The body is optional: none (or a blank one) asks for the defaults. Takes a create slot.
#[utoipa::path(post, path = "/session/{session_id}/snapshot/", tag = "snapshots",
    operation_id = "take_snapshot",
    request_body = Option<SnapshotRequest>, security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 201, body = SnapshotCreated), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody, description = "The snapshot would hold more than `SNAPSHOT_SIZE_MAX_BYTES` (files at their apparent size)"),
        (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody, description = "Too many creates, snapshots and forks in progress; retry after `Retry-After` seconds",
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
        (status = 503, body = ErrorBody),
        (status = 507, body = ErrorBody, description = "The deployment's snapshots (forks' included) leave no room under `SNAPSHOT_MAX_BYTES`")))]
pub async fn take(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<SnapshotCreated>), ApiError> {
    let sessions = fleet.at(&id)?;
    // The body is optional: none (or blank) asks for the defaults.
    let req: SnapshotRequest = if body.iter().all(u8::is_ascii_whitespace) {
        SnapshotRequest::default()
    } else {
        object(
            serde_json::from_slice(&body)
                .map_err(|e| ApiError::Unprocessable(format!("invalid body: {e}")))?,
        )?
    };
    let req = sessions
        .snapshots()
        .validate(req.name.as_deref(), req.ttl_seconds)
        .map_err(ApiError::from)?;
    let _held = sessions.lock(&id).await?;
    let (s, _) = sessions.snapshot(&id, &req).await?;
    Ok((
        StatusCode::CREATED,
        Json(SnapshotCreated {
            snapshot_id: s.id.clone(),
            name: s.name.clone(),
            created_at: rfc3339(s.created),
            size_bytes: s.size,
        }),
    ))
}

/// This deployment's snapshots, newest first.
#[utoipa::path(get, path = "/snapshots/", tag = "snapshots", operation_id = "list_snapshots",
    security(("api_key" = [])),
    responses((status = 200, body = SnapshotList), (status = 403, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn list(State(fleet): State<Arc<Fleet>>) -> Result<Json<SnapshotList>, ApiError> {
    // Every engine's that answers (a fleet's down engine lists nothing until it is back).
    let cells: Vec<_> = fleet.cells().into_iter().filter(|c| c.is_up()).collect();
    let lists = futures::future::join_all(cells.iter().map(|c| c.sessions().snapshots().list()));
    let mut all = Vec::new();
    for listed in lists.await {
        all.extend(listed?);
    }
    all.sort_by(|a, b| b.created.cmp(&a.created).then_with(|| a.id.cmp(&b.id)));
    Ok(Json(SnapshotList {
        snapshots: all.iter().map(info).collect(),
    }))
}

#[utoipa::path(get, path = "/snapshots/{snapshot_id}/", tag = "snapshots",
    operation_id = "get_snapshot", security(("api_key" = [])),
    params(("snapshot_id" = String, Path, description = "The snapshot id")),
    responses((status = 200, body = SnapshotInfo), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn get(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
) -> Result<Json<SnapshotInfo>, ApiError> {
    let sessions = fleet.at(&id)?;
    Ok(Json(info(&sessions.snapshots().get(&id).await?)))
}

/// Delete a snapshot. Sessions made from it keep working; its image and data go once none
/// uses them.
#[utoipa::path(delete, path = "/snapshots/{snapshot_id}/", tag = "snapshots",
    operation_id = "delete_snapshot", security(("api_key" = [])),
    params(("snapshot_id" = String, Path, description = "The snapshot id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn delete(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let sessions = fleet.at(&id)?;
    sessions.snapshots().delete(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// Fork a running session into `count` new sessions, each with a copy of its filesystem at this
/// instant and, for egress, its own gateway with the source's policy. The source keeps running
/// with its processes. All or nothing.
#[utoipa::path(post, path = "/session/{session_id}/fork/", tag = "snapshots",
    request_body = ForkRequest, security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 201, body = ForkResponse), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 409, body = ErrorBody),
        (status = 413, body = ErrorBody, description = "The snapshot would hold more than `SNAPSHOT_SIZE_MAX_BYTES` (files at their apparent size)"),
        (status = 422, body = ErrorBody),
        (status = 429, body = ErrorBody, description = "Too many creates, snapshots and forks in progress; retry after `Retry-After` seconds",
            headers(("Retry-After" = u64, description = "Seconds to wait before retrying"))),
        (status = 503, body = ErrorBody),
        (status = 507, body = ErrorBody, description = "The deployment's snapshots (forks' included) leave no room under `SNAPSHOT_MAX_BYTES`")))]
pub async fn fork(
    State(fleet): State<Arc<Fleet>>,
    State(admission): State<Arc<Admission>>,
    Path(id): Path<String>,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> Result<(StatusCode, Json<ForkResponse>), ApiError> {
    fleet.cell_of(&id)?;
    let req: ForkRequest = object(body)?;
    let cap = fleet.config().snapshots.fork_max;
    if !(1..=cap).contains(&req.count) {
        return Err(crate::sessions::SessionError::ForkCount(cap).into());
    }
    check_environment(req.environment.as_ref())?;
    let sessions = fleet.at_for_new(&id, req.count)?;
    // The route's layer holds one create slot; the other builds take those free now.
    let (_more, more) = admission.more_creates(req.count.saturating_sub(1) as usize);
    let _held = sessions.lock(&id).await?;
    let session_ids = sessions
        .fork(&id, req.count, req.environment, 1 + more)
        .await?;
    for fork in &session_ids {
        sessions.activity().touch(fork).await;
    }
    sessions
        .metrics()
        .sessions_created
        .inc_by(session_ids.len() as u64);
    Ok((StatusCode::CREATED, Json(ForkResponse { session_ids })))
}

/// Freeze a session (and its gateway), keeping its memory and background processes. Any
/// request to it thaws it first.
#[utoipa::path(post, path = "/session/{session_id}/pause/", tag = "snapshots",
    security(("api_key" = [])),
    params(("session_id" = String, Path, description = "The session id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 409, body = ErrorBody, description = "The session is stopped"),
        (status = 503, body = ErrorBody)))]
pub async fn pause(
    State(fleet): State<Arc<Fleet>>,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let sessions = fleet.at(&id)?;
    let _held = sessions.lock(&id).await?;
    sessions.pause(&id).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// A JSON body that is an object, as the document says: serde would also take an array for a
/// struct (its fields in order), so `[null, null]` would be a valid snapshot request.
fn object<T: serde::de::DeserializeOwned>(body: serde_json::Value) -> Result<T, ApiError> {
    if !body.is_object() {
        return Err(ApiError::Unprocessable(
            "invalid body: expected a JSON object".to_string(),
        ));
    }
    serde_json::from_value(body).map_err(|e| ApiError::Unprocessable(format!("invalid body: {e}")))
}

/// A fork's `environment` follows a create's rules (names not empty, without `=` or NUL; values
/// without NUL): 422 before anything is frozen, where the engine would refuse some (a 400 after
/// the snapshot) and take others (`A=B` becomes `A`).
fn check_environment(
    env: Option<&std::collections::BTreeMap<String, String>>,
) -> Result<(), ApiError> {
    for (k, v) in env.into_iter().flatten() {
        if k.is_empty() || k.contains(['=', '\0']) || v.contains('\0') {
            return Err(crate::sessions::SessionError::InvalidEnvironment(k.clone()).into());
        }
    }
    Ok(())
}

fn info(s: &Snapshot) -> SnapshotInfo {
    SnapshotInfo {
        snapshot_id: s.id.clone(),
        name: s.name.clone(),
        source_session_id: s.source.clone(),
        base_image: s.base_image.clone(),
        image: s.image(),
        created_at: rfc3339(s.created),
        expires_at: s.expires.map(rfc3339),
        size_bytes: s.size,
    }
}

fn rfc3339(unix: i64) -> String {
    time::OffsetDateTime::from_unix_timestamp(unix)
        .ok()
        .and_then(|t| {
            t.format(&time::format_description::well_known::Rfc3339)
                .ok()
        })
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Found by API fuzzing: `[null, null]` was a snapshot request (serde reads a struct from an
    /// array too), and a fork's environment reached the engine unchecked.
    #[test]
    fn bodies_are_objects_and_fork_environments_are_checked() {
        let status = |r: Result<(), ApiError>| r.map_err(|e| e.status());
        assert!(object::<SnapshotRequest>(json!([null, null])).is_err());
        assert!(object::<SnapshotRequest>(json!([])).is_err());
        assert!(object::<ForkRequest>(json!([1])).is_err());
        assert!(object::<SnapshotRequest>(json!({})).is_ok());
        assert_eq!(
            object::<ForkRequest>(json!({"count": 2}))
                .map(|r| r.count)
                .ok(),
            Some(2)
        );
        for bad in [
            json!({"": "x"}),
            json!({"A=B": "x"}),
            json!({"A\u{0}": "x"}),
            json!({"A": "x\u{0}"}),
        ] {
            let env = serde_json::from_value(bad.clone()).unwrap_or_default();
            assert_eq!(
                status(check_environment(Some(&env))),
                Err(StatusCode::UNPROCESSABLE_ENTITY),
                "{bad}"
            );
        }
        let env = serde_json::from_value(json!({"A": "", "b c": "=\n"})).unwrap_or_default();
        assert_eq!(status(check_environment(Some(&env))), Ok(()));
        assert_eq!(status(check_environment(None)), Ok(()));
    }
}
