//! Snapshots, forks and pause: `/session/{id}/snapshot/`, `/session/{id}/fork/`,
//! `/session/{id}/pause/` and `/snapshots/...`.

use axum::Json;
use axum::extract::{FromRequestParts, State};
use axum::http::StatusCode;
use axum::http::request::Parts;

use super::extract::{Id, param};
use super::render::{ApiJson, HttpError};
use crate::api::{
    ForkRequest, ForkResponse, SnapshotCreated, SnapshotInfo, SnapshotList, SnapshotRequest,
};
use crate::error::{ApiError, ErrorBody};
use crate::ids::SnapshotId;
use crate::ops::{Ops, lifecycle, snapshots as ops_snapshots};

/// The path's `{snapshot_id}`, or the 404 of a snapshot that does not exist.
pub struct SnapshotPath(pub SnapshotId);

impl<S: Send + Sync> FromRequestParts<S> for SnapshotPath {
    type Rejection = HttpError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, HttpError> {
        let raw = param(parts, state, "snapshot_id").await.unwrap_or_default();
        Ok(Self(ops_snapshots::snapshot_id(&raw)?))
    }
}

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
    State(ops): State<Ops>,
    Id(id): Id,
    body: axum::body::Bytes,
) -> Result<(StatusCode, Json<SnapshotCreated>), HttpError> {
    // The body is optional: none (or blank) asks for the defaults.
    let req: SnapshotRequest = if body.iter().all(u8::is_ascii_whitespace) {
        SnapshotRequest::default()
    } else {
        object(
            serde_json::from_slice(&body)
                .map_err(|e| ApiError::Unprocessable(format!("invalid body: {e}")))?,
        )?
    };
    let op = ops_snapshots::TakeSnapshot {
        name: req.name,
        ttl_seconds: req.ttl_seconds,
    };
    let snapshot = ops.apply(&id, op).await?;
    Ok((
        StatusCode::CREATED,
        Json(SnapshotCreated {
            snapshot_id: snapshot.snapshot_id,
            name: snapshot.name,
            created_at: snapshot.created_at,
            size_bytes: snapshot.size_bytes,
        }),
    ))
}

/// This deployment's snapshots, newest first.
#[utoipa::path(get, path = "/snapshots/", tag = "snapshots", operation_id = "list_snapshots",
    security(("api_key" = [])),
    responses((status = 200, body = SnapshotList), (status = 403, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn list(State(ops): State<Ops>) -> Result<Json<SnapshotList>, HttpError> {
    Ok(Json(SnapshotList {
        snapshots: ops.snapshots().await?,
    }))
}

#[utoipa::path(get, path = "/snapshots/{snapshot_id}/", tag = "snapshots",
    operation_id = "get_snapshot", security(("api_key" = [])),
    params(("snapshot_id" = String, Path, description = "The snapshot id")),
    responses((status = 200, body = SnapshotInfo), (status = 403, body = ErrorBody),
        (status = 404, body = ErrorBody), (status = 503, body = ErrorBody)))]
pub async fn get(
    State(ops): State<Ops>,
    SnapshotPath(id): SnapshotPath,
) -> Result<Json<SnapshotInfo>, HttpError> {
    Ok(Json(ops.snapshot(&id).await?))
}

/// Delete a snapshot. Sessions made from it keep working; its image and data go once none
/// uses them.
#[utoipa::path(delete, path = "/snapshots/{snapshot_id}/", tag = "snapshots",
    operation_id = "delete_snapshot", security(("api_key" = [])),
    params(("snapshot_id" = String, Path, description = "The snapshot id")),
    responses((status = 204), (status = 403, body = ErrorBody), (status = 404, body = ErrorBody),
        (status = 503, body = ErrorBody)))]
pub async fn delete(
    State(ops): State<Ops>,
    SnapshotPath(id): SnapshotPath,
) -> Result<StatusCode, HttpError> {
    ops.delete_snapshot(&id).await?;
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
    State(ops): State<Ops>,
    Id(id): Id,
    ApiJson(body): ApiJson<serde_json::Value>,
) -> Result<(StatusCode, Json<ForkResponse>), HttpError> {
    let session_ids = ops.fork(&id, object(body)?).await?;
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
pub async fn pause(State(ops): State<Ops>, Id(id): Id) -> Result<StatusCode, HttpError> {
    ops.apply(&id, lifecycle::Pause).await?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Found by API fuzzing: `[null, null]` was a snapshot request (serde reads a struct from an
    /// array too), and a fork's environment reached the engine unchecked.
    #[test]
    fn bodies_are_objects_and_fork_environments_are_checked() {
        let status = |r: Result<ForkRequest, ApiError>| r.map(drop).map_err(|e| e.status());
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
            assert_eq!(
                status(object(json!({"count": 1, "environment": bad}))),
                Err(StatusCode::UNPROCESSABLE_ENTITY),
                "{bad}"
            );
        }
        let env = json!({"A": "", "b c": "=\n"});
        assert_eq!(
            status(object(json!({"count": 1, "environment": env}))),
            Ok(())
        );
        assert_eq!(status(object(json!({"count": 1}))), Ok(()));
    }
}
