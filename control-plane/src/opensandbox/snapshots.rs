//! OpenSandbox's snapshots (`POST /v1/sandboxes/{id}/snapshots`, `/v1/snapshots...`) over the
//! native snapshot operations: a snapshot is taken whole before the answer, so it is `Ready`
//! when the 202 comes (OpenSandbox's clients poll until `Ready`, which they then see at once);
//! a sandbox is made from one through the create's `snapshotId`.

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::IntoResponse;
use serde::Deserialize;
use serde_json::{Value, json};

use super::{Answer, Failure, OpenSandbox};
use crate::api::SnapshotInfo;
use crate::ops::snapshots::{TakeSnapshot, snapshot_id};

/// The one state a snapshot here is in: taken whole before it is answered.
const READY: &str = "Ready";
/// OpenSandbox's other states, which no snapshot here is in: a filter on them matches none.
const NEVER: [&str; 3] = ["Creating", "Deleting", "Failed"];

/// OpenSandbox's `Snapshot` of one (optional fields left out, never `null`).
fn snapshot(s: &SnapshotInfo) -> Value {
    let mut v = json!({
        "id": s.snapshot_id,
        "sandboxId": s.source_session_id,
        "status": {
            "state": READY,
            "reason": "snapshot_ready",
            "lastTransitionAt": s.created_at,
        },
        "createdAt": s.created_at,
    });
    if let Some(name) = &s.name {
        v["name"] = json!(name);
    }
    v
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct NewSnapshot {
    #[serde(default)]
    name: Option<String>,
}

/// `POST /v1/sandboxes/{id}/snapshots {name?}`: 202 and the snapshot, `Ready` (taken whole, the
/// sandbox frozen only while its filesystem is captured), with its `Location`.
pub async fn create(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let req: NewSnapshot = if raw.iter().all(u8::is_ascii_whitespace) {
        NewSnapshot::default()
    } else {
        serde_json::from_slice(&raw).map_err(|e| Failure::bad_request(format!("body: {e}")))?
    };
    let take = TakeSnapshot {
        name: req.name,
        ttl_seconds: None,
    };
    // As the sandbox stands: a paused one is refused (409) until it is resumed.
    let taken = s.reach(&id, take).await?;
    let mut r = (StatusCode::ACCEPTED, Json(snapshot(&taken))).into_response();
    if let Ok(at) = HeaderValue::from_str(&format!("/v1/snapshots/{}", taken.snapshot_id)) {
        r.headers_mut().insert(header::LOCATION, at);
    }
    Ok(r)
}

/// `GET /v1/snapshots/{snapshotId}`.
pub async fn get(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    let found = s.ops.snapshot(&snapshot_id(&id)?).await?;
    Ok(Json(snapshot(&found)).into_response())
}

/// `DELETE /v1/snapshots/{snapshotId}`: 204 (sandboxes made from it keep running).
pub async fn delete(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    s.ops.delete_snapshot(&snapshot_id(&id)?).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `GET /v1/snapshots?sandboxId=&name=&state=&page=&pageSize=`: one page of the snapshots
/// (newest first) and how many there are.
pub async fn list(State(s): State<OpenSandbox>, RawQuery(q): RawQuery) -> Answer {
    let (mut page, mut size) = (1usize, 20usize);
    let number = |k: &str, v: &str| {
        v.parse::<usize>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| Failure::bad_request(format!("{k} {v:?}: 1 to 1000")))
    };
    let (mut sandbox, mut name) = (None, None);
    let mut states: Vec<String> = Vec::new();
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match &*k {
            "sandboxId" => sandbox = Some(v.into_owned()),
            "name" => name = Some(v.into_owned()),
            "state" => states.extend(
                v.split(',')
                    .map(str::trim)
                    .filter(|s| !s.is_empty())
                    .map(str::to_string),
            ),
            "page" => page = number("page", &v)?,
            "pageSize" => size = number("pageSize", &v)?,
            _ => {}
        }
    }
    let mut ready = states.is_empty();
    for st in &states {
        if st.eq_ignore_ascii_case(READY) {
            ready = true;
        } else if !NEVER.iter().any(|n| st.eq_ignore_ascii_case(n)) {
            return Err(Failure::bad_request(format!(
                "state {st:?}: one of OpenSandbox's snapshot states (Ready, Creating, Deleting, \
                 Failed)"
            )));
        }
    }
    let all = if ready {
        s.ops.snapshots().await?
    } else {
        Vec::new()
    };
    let matching: Vec<&SnapshotInfo> = all
        .iter()
        .filter(|i| sandbox.as_ref().is_none_or(|id| &i.source_session_id == id))
        .filter(|i| name.is_none() || i.name == name)
        .collect();
    let total = matching.len();
    let items: Vec<Value> = matching
        .into_iter()
        .skip((page - 1).saturating_mul(size))
        .take(size)
        .map(snapshot)
        .collect();
    Ok(super::paged(items, page, size, total))
}
