//! E2B's control API (`/sandboxes`, `/v2/sandboxes`, ...) over the native session routes. The
//! caller's `X-API-KEY` is passed on as it came, so the native key check judges it; errors are
//! E2B's `{code, message}` with the native status.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::network;
use super::refusal::{Refusal, path_id};
use super::state::{E2b, ENVD_VERSION, session_id};
use crate::api::{MetricsSample, SessionInfo, SessionState, StartSessionRequest};
use crate::auth::HEADER as API_KEY;
use crate::error::ApiError;
use crate::ops::inventory::ListQuery;
use crate::ops::lifecycle;

/// What E2B's SDK shows as the sandbox's client.
const CLIENT_ID: &str = "daiv-sandbox";
/// E2B's default lifetime, for a create that gives none.
const DEFAULT_TIMEOUT_SECS: u64 = 300;
/// `endAt` of a session without a deadline (E2B's model requires one).
const NO_END: &str = "9999-12-31T23:59:59Z";

/// A control-API failure: `{code, message}` with its status.
#[derive(Debug)]
pub struct ApiFailure(pub Refusal);

impl From<Refusal> for ApiFailure {
    fn from(r: Refusal) -> Self {
        Self(r)
    }
}

/// An operation's error, as the native route would have refused it (logged as it logs).
impl From<crate::error::ApiError> for ApiFailure {
    fn from(e: crate::error::ApiError) -> Self {
        Self(Refusal::from(e))
    }
}

impl IntoResponse for ApiFailure {
    fn into_response(self) -> Response {
        let status = self.0.status;
        (
            status,
            Json(json!({ "code": status.as_u16(), "message": self.0.detail })),
        )
            .into_response()
    }
}

pub(super) type Answer = Result<Response, ApiFailure>;

/// The caller's `X-API-KEY`, checked once for every control route (a route layer) so a wrong or
/// missing one is E2B's 401 (the native check's 403 would not be the SDK's
/// `AuthenticationException`); the native calls behind it then go with the deployment's key.
pub async fn require_key(
    State(e): State<E2b>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Answer {
    use crate::auth::{KeyRefusal, check_key};
    let given = req.headers().get(API_KEY).map(|v| v.as_bytes());
    check_key(&e.config, given).map_err(|refusal| {
        ApiFailure(Refusal::new(
            StatusCode::UNAUTHORIZED,
            match refusal {
                KeyRefusal::Missing => "missing API key: send it as X-API-KEY (E2B_API_KEY)",
                KeyRefusal::Invalid => {
                    "invalid API key (E2B_API_KEY must be the deployment's API key)"
                }
            },
        ))
    })?;
    Ok(next.run(req).await)
}

/// The `{id}` of a sandbox route, checked to be one a native path can carry (else a 404).
pub struct SandboxId(pub String);

impl<S: Send + Sync> axum::extract::FromRequestParts<S> for SandboxId {
    type Rejection = ApiFailure;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &S,
    ) -> Result<Self, ApiFailure> {
        let Path(raw) = Path::<String>::from_request_parts(parts, state)
            .await
            .map_err(|e| ApiFailure(Refusal::new(StatusCode::NOT_FOUND, e.body_text())))?;
        id(&raw).map(|id| SandboxId(id.to_string()))
    }
}

fn id(raw: &str) -> Result<&str, ApiFailure> {
    path_id(raw).ok_or_else(|| {
        ApiFailure(Refusal::new(
            StatusCode::NOT_FOUND,
            format!("sandbox {raw:?} not found"),
        ))
    })
}

/// A JSON body, `{}` for an empty one; a malformed one is a 400.
pub(super) fn body<T: for<'de> Deserialize<'de>>(raw: &[u8]) -> Result<T, ApiFailure> {
    let raw = if raw.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        raw
    };
    serde_json::from_slice(raw)
        .map_err(|e| ApiFailure(Refusal::new(StatusCode::BAD_REQUEST, format!("body: {e}"))))
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    timeout: Option<u64>,
    auto_pause: Option<bool>,
    metadata: Option<BTreeMap<String, String>>,
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    network: Option<network::NetworkSpec>,
}

/// `POST /sandboxes` and `POST /v2/sandboxes`.
pub async fn create(State(e): State<E2b>, raw: axum::body::Bytes) -> Answer {
    let req: NewSandbox = body(&raw)?;
    let mut start = json!({
        "timeout_seconds": req.timeout.unwrap_or(DEFAULT_TIMEOUT_SECS),
        "on_timeout": if req.auto_pause.unwrap_or(false) { "pause" } else { "remove" },
    });
    match e.config.e2b.templates.get(&req.template_id) {
        Some(image) => start["base_image"] = json!(image),
        None if looks_like_snapshot(&req.template_id) => {
            start["snapshot_id"] = json!(req.template_id)
        }
        None => return Err(template_not_found(&req.template_id)),
    }
    // E2B's user as its SDK and its users assume it: `$HOME` and `~` are `/home/user` (where
    // commands start and relative paths land) and `$USER` is `user` (the image names uid 1000
    // `user` first). The caller's own values win.
    let mut env = e2b_user_env();
    env.extend(req.env_vars.clone().unwrap_or_default());
    start["environment"] = json!(env);
    let private = req.network.as_ref().is_some_and(|n| n.private_traffic());
    let mut metadata = req.metadata.clone().unwrap_or_default();
    metadata.remove(super::token::PRIVATE_TRAFFIC);
    if private {
        metadata.insert(super::token::PRIVATE_TRAFFIC.to_string(), "1".to_string());
    }
    if !metadata.is_empty() {
        start["metadata"] = json!(metadata);
    }
    if let Some(policy) =
        network::policy(&e.config, req.allow_internet_access, req.network.as_ref())?
    {
        start["egress"] = policy;
    }
    let from_snapshot = start.get("snapshot_id").is_some();
    // The native create's request, checked as its route checks its body.
    let start: StartSessionRequest = serde_json::from_value(start).map_err(|err| {
        ApiFailure(Refusal::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("invalid body: {err}"),
        ))
    })?;
    let created = e.ops.create(&start).await.map_err(|err| {
        // A snapshot id of no snapshot of ours: the template is unknown.
        if err.status() == StatusCode::NOT_FOUND && from_snapshot {
            template_not_found(&req.template_id)
        } else {
            ApiFailure::from(err)
        }
    })?;
    let mut answer = sandbox(&e, &created, &req.template_id);
    if private {
        answer["trafficAccessToken"] = json!(e.tokens.traffic(&created));
    }
    Ok((StatusCode::CREATED, Json(answer)).into_response())
}

/// The environment of E2B's user (`layout::E2B_HOME`), under the caller's.
fn e2b_user_env() -> BTreeMap<String, String> {
    let home = crate::layout::E2B_HOME;
    [
        ("HOME", home.to_string()),
        ("USER", "user".to_string()),
        ("LOGNAME", "user".to_string()),
        ("XDG_CONFIG_HOME", format!("{home}/.config")),
        ("XDG_CACHE_HOME", format!("{home}/.cache")),
        ("XDG_DATA_HOME", format!("{home}/.local/share")),
        ("XDG_STATE_HOME", format!("{home}/.local/state")),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

pub(super) fn template_not_found(id: &str) -> ApiFailure {
    ApiFailure(Refusal::new(
        StatusCode::NOT_FOUND,
        format!(
            "template '{id}' not found (a name of DAIV_SANDBOX_E2B_TEMPLATES or a snapshot id)"
        ),
    ))
}

/// A snapshot id of ours (hex), as a `templateID` may name one.
pub(super) fn looks_like_snapshot(id: &str) -> bool {
    (8..=128).contains(&id.len()) && id.bytes().all(|b| b.is_ascii_hexdigit())
}

/// The create and connect answer (E2B's `Sandbox`); its `domain` is the preview domain the
/// SDK's `get_host(port)` builds on, when one is set.
pub(super) fn sandbox(e: &E2b, id: &str, template: &str) -> Value {
    let mut v = json!({
        "sandboxID": id,
        "templateID": template,
        "alias": template,
        "clientID": CLIENT_ID,
        "envdVersion": ENVD_VERSION,
        "envdAccessToken": e.tokens.token(id),
    });
    if let Some(domain) = &e.config.ingress.preview_domain {
        v["domain"] = json!(domain);
    }
    v
}

/// The template a session was made from: the template name whose image it runs, else its
/// snapshot id, else its image.
pub(super) fn template_of(e: &E2b, s: &SessionInfo) -> String {
    if let Some(snap) = &s.snapshot_id {
        return snap.clone();
    }
    e.config
        .e2b
        .templates
        .iter()
        .find(|(_, image)| **image == s.base_image)
        .map(|(name, _)| name.clone())
        .unwrap_or_else(|| s.base_image.clone())
}

fn state(s: SessionState) -> &'static str {
    match s {
        SessionState::Running => "running",
        // A stopped session is not running; E2B knows only the two.
        SessionState::Paused | SessionState::Stopped => "paused",
    }
}

/// E2B's `ListedSandbox` / `SandboxDetail` of a session.
fn detail(e: &E2b, s: &SessionInfo, with_token: bool) -> Value {
    let cpus = s.cpus.map(|c| c.ceil() as u64).unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get() as u64)
            .unwrap_or(1)
    });
    let template = template_of(e, s);
    let mut v = json!({
        "sandboxID": s.session_id,
        "templateID": template,
        "alias": template,
        "clientID": CLIENT_ID,
        "startedAt": s.created_at,
        "endAt": s.expires_at.as_deref().unwrap_or(NO_END),
        "cpuCount": cpus,
        "memoryMB": s.memory_bytes.map(|b| b / (1024 * 1024)).unwrap_or(0),
        "diskSizeMB": 0,
        "envdVersion": ENVD_VERSION,
        "state": state(s.state),
        "metadata": s.metadata.without(super::token::PRIVATE_TRAFFIC),
    });
    if let Some(domain) = &e.config.ingress.preview_domain {
        v["domain"] = json!(domain);
    }
    if with_token {
        v["envdAccessToken"] = json!(e.tokens.token(&s.session_id));
    }
    v
}

pub(super) async fn info(e: &E2b, id: &str) -> Result<SessionInfo, ApiFailure> {
    Ok(e.ops.info(&super::state::session_id(id)?).await?)
}

/// `GET /sandboxes/{id}`.
pub async fn get(State(e): State<E2b>, SandboxId(id): SandboxId) -> Answer {
    let s = info(&e, &id).await?;
    Ok(Json(detail(&e, &s, true)).into_response())
}

/// `DELETE /sandboxes/{id}`: the session removed (a native close without `force` would only stop
/// it) and its polled watchers with it; 204, or 404 (the SDK's `kill` answers `False`).
pub async fn kill(State(e): State<E2b>, SandboxId(id): SandboxId) -> Answer {
    let id = id.as_str();
    let removed = e
        .ops
        .apply(&super::state::session_id(id)?, lifecycle::Remove)
        .await;
    if removed.is_ok() || matches!(removed, Err(ApiError::NotFound)) {
        e.watchers.remove_sandbox(id);
    }
    removed?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Deserialize)]
struct TimeoutBody {
    timeout: u64,
}

/// `POST /sandboxes/{id}/timeout {timeout}`.
pub async fn timeout(
    State(e): State<E2b>,
    SandboxId(id): SandboxId,
    raw_body: axum::body::Bytes,
) -> Answer {
    let id = id.as_str();
    let req: TimeoutBody = body(&raw_body)?;
    // E2B's `set_timeout(0)` ends the sandbox now: the soonest deadline ours takes, a second.
    set_timeout(&e, id, req.timeout.max(1)).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn set_timeout(e: &E2b, id: &str, seconds: u64) -> Result<(), ApiFailure> {
    let op = lifecycle::SetTimeout { seconds };
    e.ops.apply(&super::state::session_id(id)?, op).await?;
    Ok(())
}

/// `POST /sandboxes/{id}/pause`: 204; 409 when it is already paused.
pub async fn pause(State(e): State<E2b>, SandboxId(id): SandboxId) -> Answer {
    let id = id.as_str();
    if info(&e, id).await?.state != SessionState::Running {
        return Err(ApiFailure(Refusal::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        )));
    }
    e.ops
        .apply(&super::state::session_id(id)?, lifecycle::Pause)
        .await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

#[derive(Debug, Default, Deserialize)]
struct ConnectBody {
    timeout: Option<u64>,
}

/// `POST /v2/sandboxes/{id}/connect` and `POST /sandboxes/{id}/resume`: a paused sandbox is
/// thawed (201), a running one answered as it is (200); `timeout` moves its deadline.
pub async fn connect(
    State(e): State<E2b>,
    SandboxId(id): SandboxId,
    raw_body: axum::body::Bytes,
) -> Answer {
    let id = id.as_str();
    let req: ConnectBody = body(&raw_body)?;
    // One operation under the session's lock: resume, and lengthen its life (never shorten).
    let sid = super::state::session_id(id)?;
    let connect = crate::ops::lifecycle::Connect {
        timeout: req.timeout,
    };
    let connected = e.ops.apply(&sid, connect).await?;
    let status = if connected.resumed {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    let template = template_of(&e, &connected.info);
    let mut answer = sandbox(&e, id, &template);
    if connected
        .info
        .metadata
        .contains_key(super::token::PRIVATE_TRAFFIC)
    {
        answer["trafficAccessToken"] = json!(e.tokens.traffic(id));
    }
    Ok((status, Json(answer)).into_response())
}

/// `GET /v2/sandboxes` (and v1's `GET /sandboxes`): `metadata` (`k=v&k2=v2`, URL-encoded),
/// `state` (repeated or comma-separated), `startedAfter`, `template`, `order` (newest first
/// unless `asc`), `limit`, `nextToken`; the next page's token in `x-next-token`.
pub async fn list(State(e): State<E2b>, RawQuery(q): RawQuery) -> Answer {
    let mut native: Vec<(String, String)> = Vec::new();
    let mut states: Vec<String> = Vec::new();
    let (mut order, mut template) = (String::new(), None::<String>);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match &*k {
            "metadata" | "query" => {
                // `k=v&k2=v2`, each key and value percent-encoded once more by the SDK.
                for (mk, mv) in form_urlencoded::parse(v.as_bytes()) {
                    let (mk, mv) = (unescape(&mk), unescape(&mv));
                    native.push(("metadata".into(), format!("{mk}={mv}")));
                }
            }
            "state" => states.extend(v.split(',').map(|s| s.trim().to_string())),
            "limit" => native.push(("limit".into(), v.into_owned())),
            "nextToken" => native.push(("next".into(), v.into_owned())),
            "order" => order = v.into_owned(),
            "startedAfter" => {
                let at = crate::time::parse_rfc3339(&v).ok_or_else(|| {
                    ApiFailure(Refusal::new(
                        StatusCode::BAD_REQUEST,
                        format!("startedAfter {v:?}: not an RFC 3339 time"),
                    ))
                })?;
                // Started at or after it: a whole second of creation from the next one on.
                let secs = at.unix_timestamp() + i64::from(at.nanosecond() > 0);
                native.push(("created_after".into(), secs.to_string()));
            }
            "template" => template = Some(v.into_owned()),
            _ => {}
        }
    }
    // E2B lists the newest first unless told otherwise.
    match order.as_str() {
        "" | "desc" => native.push(("order".into(), "desc".into())),
        "asc" => {}
        other => {
            return Err(ApiFailure(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("order {other:?}: expected asc or desc"),
            )));
        }
    }
    // E2B's states are running and paused; ours add stopped, which E2B shows as paused.
    let wanted: Vec<&str> = states
        .iter()
        .map(String::as_str)
        .filter(|s| !s.is_empty())
        .collect();
    for s in &wanted {
        if !matches!(*s, "running" | "paused") {
            return Err(ApiFailure(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("state {s:?}: expected running or paused"),
            )));
        }
    }
    // Filtered natively, so every page is full and its cursor right: E2B's paused is ours
    // paused or stopped.
    for s in &wanted {
        let ours: &[&str] = match *s {
            "running" => &["running"],
            _ => &["paused", "stopped"],
        };
        native.extend(ours.iter().map(|o| ("state".to_string(), o.to_string())));
    }
    let page = e.ops.list(&ListQuery::parse(&native)?).await?;
    let sandboxes: Vec<Value> = page
        .sessions
        .iter()
        .filter(|s| template.as_ref().is_none_or(|t| *t == template_of(&e, s)))
        .map(|s| detail(&e, s, false))
        .collect();
    let mut resp = Json(sandboxes).into_response();
    if let Some(next) = page.next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        resp.headers_mut().insert("x-next-token", next);
    }
    Ok(resp)
}

/// `GET /sandboxes/{id}/metrics?start=&end=` (unix seconds).
pub async fn metrics(
    State(e): State<E2b>,
    SandboxId(id): SandboxId,
    RawQuery(q): RawQuery,
) -> Answer {
    let (mut start, mut end) = (None, None);
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        let at = match &*k {
            "start" => &mut start,
            "end" => &mut end,
            _ => continue,
        };
        *at = Some(v.parse::<i64>().map_err(|_| {
            ApiFailure(Refusal::new(
                StatusCode::BAD_REQUEST,
                format!("{k}={v:?}: expected Unix seconds"),
            ))
        })?);
    }
    let samples = e.ops.metrics(&session_id(&id)?, start, end).await?;
    Ok(Json(samples.iter().map(metric).collect::<Vec<_>>()).into_response())
}

fn unescape(s: &str) -> String {
    percent_encoding::percent_decode_str(s)
        .decode_utf8_lossy()
        .into_owned()
}

fn metric(m: &MetricsSample) -> Value {
    json!({
        "timestamp": crate::time::rfc3339(m.timestamp_unix),
        "timestampUnix": m.timestamp_unix,
        "cpuCount": m.cpu_count.ceil() as u64,
        "cpuUsedPct": m.cpu_used_pct,
        "memUsed": m.mem_used,
        "memTotal": m.mem_total,
        "memCache": m.mem_cache,
        "diskUsed": m.disk_used,
        "diskTotal": m.disk_total,
    })
}

/// `PUT /sandboxes/{id}/network`: the sandbox's egress policy replaced.
pub async fn update_network(
    State(e): State<E2b>,
    SandboxId(id): SandboxId,
    raw_body: axum::body::Bytes,
) -> Answer {
    let id = id.as_str();
    let spec = body::<network::NetworkSpec>(&raw_body)?.for_update();
    let policy = network::policy(&e.config, None, Some(&spec))?.ok_or_else(|| {
        ApiFailure(Refusal::new(
            StatusCode::BAD_REQUEST,
            "a network update needs allowOut, denyOut or rules",
        ))
    })?;
    let op = lifecycle::RefreshEgress { policy };
    e.ops.apply(&session_id(id)?, op).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
