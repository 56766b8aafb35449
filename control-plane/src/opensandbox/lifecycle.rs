//! OpenSandbox's lifecycle API (`/v1/sandboxes...`) over the native session operations. The
//! caller's `OPEN-SANDBOX-API-KEY` is checked once for every route (a 401 in OpenSandbox's
//! words); the operations behind it then run as the native routes run them.

use std::collections::BTreeMap;

use axum::Json;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{
    API_KEY_HEADER, Answer, EGRESS_PORT, EXECD_PORT, EXECD_TOKEN_HEADER, Failure, OpenSandbox,
    session_id,
};
use crate::api::{Metadata, SessionInfo, SessionState, StartSessionRequest};
use crate::ops::inventory::ListQuery;
use crate::ops::lifecycle;
use crate::ops::processes as op;

/// The metadata keys this service keeps for itself (E2B's private-traffic marker, the
/// entrypoint below): never shown, set or removed through OpenSandbox's metadata.
pub const RESERVED_PREFIX: &str = "daiv.";
/// The metadata key keeping a sandbox's entrypoint (shown as `entrypoint`, never as metadata).
pub const ENTRYPOINT_KEY: &str = "daiv.opensandbox.entrypoint";
/// The entrypoint a sandbox shows when it was given none that runs anything: OpenSandbox's
/// default, which only keeps its container alive (ours are kept alive anyway).
const KEEP_ALIVE: [&str; 3] = ["tail", "-f", "/dev/null"];
/// The background process an entrypoint runs as.
pub const ENTRYPOINT_PROCESS: &str = "entrypoint";
/// Most sandboxes one listing walks to count its pages.
const LIST_MAX: usize = 10_000;
/// Sandboxes per native listing it walks (the native maximum: one inventory each).
const LIST_PAGE: usize = 1000;

/// `OPEN-SANDBOX-API-KEY`, checked for every lifecycle route: a wrong or missing one is a 401
/// (the SDK's `SandboxApiException` with `UNAUTHORIZED`).
pub async fn require_key(
    State(s): State<OpenSandbox>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Answer {
    use crate::auth::{KeyRefusal, check_key};
    let given = req.headers().get(API_KEY_HEADER).map(|v| v.as_bytes());
    check_key(&s.config, given).map_err(|refusal| {
        Failure::new(
            StatusCode::UNAUTHORIZED,
            match refusal {
                KeyRefusal::Missing => {
                    "missing API key: send it as OPEN-SANDBOX-API-KEY (OPEN_SANDBOX_API_KEY)"
                }
                KeyRefusal::Invalid => {
                    "invalid API key (OPEN_SANDBOX_API_KEY must be the deployment's API key)"
                }
            },
        )
    })?;
    Ok(next.run(req).await)
}

/// A JSON body, `{}` for an empty one; a malformed one is a 400.
fn body<T: for<'de> Deserialize<'de>>(raw: &[u8]) -> Result<T, Failure> {
    let raw = if raw.iter().all(u8::is_ascii_whitespace) {
        &b"{}"[..]
    } else {
        raw
    };
    serde_json::from_slice(raw).map_err(|e| Failure::bad_request(format!("body: {e}")))
}

#[derive(Debug, Deserialize)]
struct Image {
    uri: String,
    #[serde(default)]
    auth: Option<Value>,
}

#[derive(Debug, Default, Deserialize)]
struct Resources {
    #[serde(default)]
    cpu: Option<String>,
    #[serde(default)]
    memory: Option<String>,
    #[serde(flatten)]
    other: BTreeMap<String, Value>,
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewSandbox {
    #[serde(default)]
    image: Option<Image>,
    #[serde(default)]
    snapshot_id: Option<String>,
    /// Seconds; `null` (or absent): no deadline, the sandbox lives until it is killed.
    #[serde(default)]
    timeout: Option<u64>,
    #[serde(default)]
    resource_limits: Option<Resources>,
    #[serde(default)]
    env: Option<BTreeMap<String, String>>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    entrypoint: Option<Vec<String>>,
    #[serde(default)]
    network_policy: Option<super::egress::NetworkPolicy>,
    #[serde(default)]
    volumes: Option<Value>,
    #[serde(default)]
    credential_proxy: Option<Value>,
    #[serde(default)]
    platform: Option<Value>,
}

/// `POST /v1/sandboxes`: 202 and the sandbox, running (the SDK then asks for execd's endpoint
/// and pings it). An entrypoint other than OpenSandbox's keep-alive default runs as the
/// sandbox's background process `entrypoint`.
pub async fn create(State(s): State<OpenSandbox>, raw: axum::body::Bytes) -> Answer {
    let req: NewSandbox = body(&raw)?;
    if req.volumes.as_ref().is_some_and(|v| !v.is_null()) {
        return Err(Failure::new(
            StatusCode::NOT_IMPLEMENTED,
            "volumes is not served by this OpenSandbox API yet",
        ));
    }
    // Credential injection needs no switch here (the gateway terminates TLS where a binding
    // matches), but as OpenSandbox's, it needs a network policy.
    let proxy_on = req
        .credential_proxy
        .as_ref()
        .and_then(|c| c.get("enabled"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    if proxy_on && req.network_policy.is_none() {
        return Err(Failure::bad_request(
            "credentialProxy.enabled requires networkPolicy",
        ));
    }
    let egress = req
        .network_policy
        .as_ref()
        .map(super::egress::create_body)
        .transpose()?;
    if req.image.as_ref().is_some_and(|i| i.auth.is_some()) {
        return Err(Failure::bad_request(
            "image.auth: registry credentials are the deployment's (its Docker config), not a \
             request's",
        ));
    }
    if let Some(p) = &req.platform
        && let Some(os) = p.get("os").and_then(Value::as_str)
        && os != "linux"
    {
        return Err(Failure::bad_request(format!(
            "platform.os {os:?}: sandboxes here run Linux"
        )));
    }
    if let Some(k) = req
        .metadata
        .iter()
        .flatten()
        .map(|(k, _)| k)
        .find(|k| k.starts_with(RESERVED_PREFIX))
    {
        return Err(reserved(k));
    }
    let mut start = json!({ "on_timeout": "remove" });
    if let Some(e) = egress {
        start["egress"] = e;
    }
    if let Some(t) = req.timeout {
        start["timeout_seconds"] = json!(t);
    }
    match (&req.image, &req.snapshot_id) {
        (Some(_), Some(_)) => {
            return Err(Failure::bad_request(
                "image or snapshotId: a sandbox is made from one of them",
            ));
        }
        (None, Some(snap)) => start["snapshot_id"] = json!(snap),
        (Some(image), None) => start["base_image"] = json!(image.uri),
        (None, None) => return Err(Failure::bad_request("image.uri or snapshotId is required")),
    }
    if let Some(r) = &req.resource_limits {
        if let Some(k) = r.other.keys().next() {
            return Err(Failure::bad_request(format!(
                "resourceLimits.{k}: only cpu and memory are limited here"
            )));
        }
        if let Some(cpu) = &r.cpu {
            start["cpus"] = json!(cpus(cpu)?);
        }
        if let Some(memory) = &r.memory {
            start["memory_bytes"] = json!(bytes(memory)?);
        }
    }
    if let Some(env) = &req.env
        && !env.is_empty()
    {
        start["environment"] = json!(env);
    }
    let entrypoint = req.entrypoint.clone().filter(|e| !e.is_empty());
    let runs = entrypoint.clone().filter(|e| !keeps_alive(e));
    let mut metadata = req.metadata.clone().unwrap_or_default();
    if let Some(e) = &runs {
        metadata.insert(ENTRYPOINT_KEY.to_string(), json!(e).to_string());
    }
    if !metadata.is_empty() {
        start["metadata"] = json!(metadata);
    }
    let start: StartSessionRequest = serde_json::from_value(start)
        .map_err(|e| Failure::bad_request(format!("invalid body: {e}")))?;
    let id = s.ops.create(&start).await?;
    if let Some(words) = &runs {
        let started = op::StartFollowed {
            req: crate::api::StartProcessRequest {
                command: words
                    .iter()
                    .map(|w| shell_quote(w))
                    .collect::<Vec<_>>()
                    .join(" "),
                environment: None,
                workdir: None,
                process_id: Some(ENTRYPOINT_PROCESS.to_string()),
                tag: Some("entrypoint".to_string()),
                pty: None,
            },
            default_workdir: None,
            keep_stdin: false,
        };
        // The sandbox without its entrypoint is not the one asked for: it goes.
        if let Err(e) = s.reach(&id, started).await {
            let _ = s.reach(&id, lifecycle::Remove).await;
            return Err(e);
        }
    }
    let info = s.ops.info(&session_id(&id)?).await?;
    Ok((StatusCode::ACCEPTED, Json(sandbox(&info))).into_response())
}

/// Whether `words` only keeps a container alive (OpenSandbox's default and its like).
fn keeps_alive(words: &[String]) -> bool {
    let w: Vec<&str> = words.iter().map(String::as_str).collect();
    w == KEEP_ALIVE || w == ["sleep", "infinity"]
}

/// One word for `bash -c`, always quoted: a first word such as `FOO=1` or `time` is then the
/// command it names, never shell syntax.
pub(super) fn shell_quote(w: &str) -> String {
    format!("'{}'", w.replace('\'', r"'\''"))
}

/// A refusal of a key this service keeps.
fn reserved(k: &str) -> Failure {
    Failure::bad_request(format!(
        "metadata key {k:?}: keys under {RESERVED_PREFIX:?} are this service's"
    ))
}

/// A Kubernetes CPU quantity (`"1"`, `"0.5"`, `"500m"`) as CPUs.
fn cpus(q: &str) -> Result<f64, Failure> {
    let q = q.trim();
    let v = match q.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().map(|m| m / 1000.0),
        None => q.parse::<f64>(),
    };
    match v {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(Failure::bad_request(format!(
            "resourceLimits.cpu {q:?}: a CPU quantity such as \"1\", \"0.5\" or \"500m\""
        ))),
    }
}

/// A Kubernetes memory quantity (`"2Gi"`, `"512Mi"`, `"1G"`, `"1000000"`) as bytes.
fn bytes(q: &str) -> Result<i64, Failure> {
    let q = q.trim();
    let units: [(&str, f64); 12] = [
        ("Ki", 1024.0),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("Ti", 1024f64.powi(4)),
        ("Pi", 1024f64.powi(5)),
        ("Ei", 1024f64.powi(6)),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
        ("T", 1e12),
        ("P", 1e15),
        ("E", 1e18),
    ];
    let (num, scale) = units
        .iter()
        .find_map(|(u, f)| q.strip_suffix(u).map(|n| (n, *f)))
        .unwrap_or((q, 1.0));
    match num.parse::<f64>() {
        Ok(n) if n.is_finite() && n > 0.0 && n * scale < i64::MAX as f64 => {
            Ok((n * scale).round() as i64)
        }
        _ => Err(Failure::bad_request(format!(
            "resourceLimits.memory {q:?}: a memory quantity such as \"2Gi\" or \"512Mi\""
        ))),
    }
}

/// OpenSandbox's state name of a session's state: a stopped session starts again on
/// `resume`, as a paused one does.
fn state(s: SessionState) -> &'static str {
    match s {
        SessionState::Running => "Running",
        SessionState::Paused | SessionState::Stopped => "Paused",
    }
}

/// OpenSandbox's `Sandbox` of a session (optional fields left out, never `null`: the SDK's
/// parser takes a `null` for a value).
fn sandbox(s: &SessionInfo) -> Value {
    let entrypoint: Vec<String> = s
        .metadata
        .clone()
        .into_inner()
        .get(ENTRYPOINT_KEY)
        .and_then(|e| serde_json::from_str(e).ok())
        .unwrap_or_else(|| KEEP_ALIVE.iter().map(|w| w.to_string()).collect());
    let mut v = json!({
        "id": s.session_id,
        "status": { "state": state(s.state) },
        "createdAt": s.created_at,
        "entrypoint": entrypoint,
        "metadata": shown(&s.metadata),
    });
    match &s.snapshot_id {
        Some(snap) => v["snapshotId"] = json!(snap),
        None => v["image"] = json!({ "uri": s.base_image }),
    }
    if let Some(at) = &s.expires_at {
        v["expiresAt"] = json!(at);
    }
    v
}

/// An operation on a sandbox's life (a pause, a deadline, its metadata, its removal): none
/// needs it running.
async fn life<O: crate::ops::Op>(s: &OpenSandbox, id: &str, op: O) -> Result<O::Output, Failure> {
    Ok(s.ops.apply(&session_id(id)?, op).await?)
}

/// The metadata a client sees: its own keys, not this service's.
fn shown(m: &Metadata) -> BTreeMap<String, String> {
    m.clone()
        .into_inner()
        .into_iter()
        .filter(|(k, _)| !k.starts_with(RESERVED_PREFIX))
        .collect()
}

async fn info(s: &OpenSandbox, id: &str) -> Result<SessionInfo, Failure> {
    Ok(s.ops.info(&session_id(id)?).await?)
}

/// `GET /v1/sandboxes/{id}`.
pub async fn get(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    Ok(Json(sandbox(&info(&s, &id).await?)).into_response())
}

/// `DELETE /v1/sandboxes/{id}`: the session removed; 204, or 404.
pub async fn kill(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    life(&s, &id, lifecycle::Remove).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/sandboxes/{id}/pause`: 202 once paused (a paused sandbox's execd answers that it
/// is paused until `resume`).
pub async fn pause(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    life(&s, &id, lifecycle::Pause).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

/// `POST /v1/sandboxes/{id}/resume`: 202 once running again (thawed, or started when stopped).
pub async fn resume(State(s): State<OpenSandbox>, Path(id): Path<String>) -> Answer {
    let id = session_id(&id)?;
    s.ops.apply(&id, lifecycle::EnsureRunning).await?;
    Ok(StatusCode::ACCEPTED.into_response())
}

#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Renewal {
    expires_at: String,
}

/// `POST /v1/sandboxes/{id}/renew-expiration {expiresAt}`: the deadline moved there (to the
/// next whole second); answers the new `expiresAt`.
pub async fn renew(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let req: Renewal = body(&raw)?;
    let at = crate::time::parse_rfc3339(&req.expires_at).ok_or_else(|| {
        Failure::bad_request(format!(
            "expiresAt {:?}: not an RFC 3339 time",
            req.expires_at
        ))
    })?;
    // The deadline is kept in whole seconds from now: the first second at or after the one
    // asked for.
    let wanted = at.unix_timestamp() + i64::from(at.nanosecond() > 0);
    let ahead = wanted - crate::time::unix_now();
    if ahead < 1 {
        return Err(Failure::bad_request(format!(
            "expiresAt {:?} is not in the future",
            req.expires_at
        )));
    }
    let seconds = u64::try_from(ahead).unwrap_or(u64::MAX);
    if seconds > crate::api::MAX_SESSION_TIMEOUT_SECS {
        return Err(Failure::bad_request(format!(
            "expiresAt {:?}: at most 30 days from now",
            req.expires_at
        )));
    }
    let info = life(&s, &id, lifecycle::SetTimeout { seconds }).await?;
    Ok(Json(json!({ "expiresAt": info.expires_at })).into_response())
}

/// `PATCH /v1/sandboxes/{id}/metadata`: a JSON merge patch of string values (`null` removes a
/// key); answers the sandbox.
pub async fn metadata(
    State(s): State<OpenSandbox>,
    Path(id): Path<String>,
    raw: axum::body::Bytes,
) -> Answer {
    let patch: BTreeMap<String, Option<String>> = body(&raw)?;
    if let Some(k) = patch.keys().find(|k| k.starts_with(RESERVED_PREFIX)) {
        return Err(reserved(k));
    }
    // Merged under the session's lock: two patches side by side both land.
    let info = life(&s, &id, lifecycle::PatchMetadata { patch }).await?;
    Ok(Json(sandbox(&info)).into_response())
}

/// `GET /v1/sandboxes?state=&metadata=&page=&pageSize=`: one page of the sandboxes (oldest
/// first) and how many there are.
pub async fn list(State(s): State<OpenSandbox>, RawQuery(q): RawQuery) -> Answer {
    let mut native: Vec<(String, String)> = Vec::new();
    let (mut page, mut size) = (1usize, 20usize);
    let number = |k: &str, v: &str| {
        v.parse::<usize>()
            .ok()
            .filter(|n| (1..=1000).contains(n))
            .ok_or_else(|| Failure::bad_request(format!("{k} {v:?}: 1 to 1000")))
    };
    let mut states = Vec::new();
    for (k, v) in form_urlencoded::parse(q.unwrap_or_default().as_bytes()) {
        match &*k {
            "metadata" => {
                // `k=v&k2=v2`, encoded once more by the SDK.
                for (mk, mv) in form_urlencoded::parse(v.as_bytes()) {
                    native.push(("metadata".into(), format!("{mk}={mv}")));
                }
            }
            "state" => states.extend(v.split(',').map(|s| s.trim().to_string())),
            "page" => page = number("page", &v)?,
            "pageSize" => size = number("pageSize", &v)?,
            _ => {}
        }
    }
    for st in states.iter().filter(|s| !s.is_empty()) {
        let ours: &[&str] = match st.to_ascii_lowercase().as_str() {
            "running" => &["running"],
            "paused" => &["paused", "stopped"],
            // States a session here never is in: none match.
            "pending" | "pausing" | "resuming" | "stopping" | "terminated" | "failed"
            | "unknown" => &[],
            _ => {
                return Err(Failure::bad_request(format!(
                    "state {st:?}: one of OpenSandbox's states (Running, Paused, ...)"
                )));
            }
        };
        native.extend(ours.iter().map(|o| ("state".to_string(), o.to_string())));
    }
    let none_can_match = !states.is_empty() && !native.iter().any(|(k, _)| k == "state");
    // Counted whole (the pagination's totals), kept for the page asked for only.
    let window = (page - 1).saturating_mul(size)..page.saturating_mul(size);
    let (mut total, mut items) = (0usize, Vec::new());
    if !none_can_match {
        let mut next: Option<String> = None;
        loop {
            let mut pairs = native.clone();
            pairs.push(("limit".into(), LIST_PAGE.to_string()));
            if let Some(n) = &next {
                pairs.push(("next".into(), n.clone()));
            }
            let listed = s
                .ops
                .list(&ListQuery::parse(&pairs).map_err(Failure::from)?)
                .await?;
            for info in &listed.sessions {
                if window.contains(&total) {
                    items.push(sandbox(info));
                }
                total += 1;
            }
            next = listed.next;
            if next.is_none() || total >= LIST_MAX {
                break;
            }
        }
    }
    Ok(super::paged(items, page, size, total))
}

/// `GET /v1/sandboxes/{id}/endpoints/{port}`: where the SDK reaches execd (44772) and the
/// egress sidecar (18080): this listener, under a path naming the sandbox, as the host the
/// caller used (scheme-less, as the SDK puts its protocol in front), with the sandbox's execd
/// token in the headers it sends on every execd call.
pub async fn endpoint(
    State(s): State<OpenSandbox>,
    Path((id, port)): Path<(String, String)>,
    headers: HeaderMap,
) -> Answer {
    let port: u16 = port
        .parse()
        .map_err(|_| Failure::bad_request(format!("port {port:?}: 1 to 65535")))?;
    info(&s, &id).await?;
    let host = host(&s, &headers);
    let (endpoint, header, token) = match port {
        EXECD_PORT => (
            format!("{host}/execd/{id}"),
            EXECD_TOKEN_HEADER,
            s.tokens.token(&id),
        ),
        EGRESS_PORT => (
            format!("{host}/egress/{id}"),
            super::EGRESS_TOKEN_HEADER,
            s.egress_tokens.token(&id),
        ),
        // A server of the sandbox's own, through the ingress relay (`/ports/{id}/{port}`).
        other => {
            crate::ops::ports::check_port(other)?;
            let subject = super::port_subject(&id, &other.to_string());
            (
                format!("{host}/ports/{id}/{other}"),
                super::PORT_TOKEN_HEADER,
                s.port_tokens.token(&subject),
            )
        }
    };
    Ok(Json(json!({
        "endpoint": endpoint,
        "headers": { header.to_ascii_uppercase(): token },
    }))
    .into_response())
}

/// The host (and port) the caller reached this listener at, when it is a plain one; else the
/// listener's own address.
fn host(s: &OpenSandbox, headers: &HeaderMap) -> String {
    let given = headers
        .get(axum::http::header::HOST)
        .and_then(|h| h.to_str().ok())
        .filter(|h| {
            !h.is_empty()
                && h.len() <= 255
                && h.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b".-:[]".contains(&b))
        });
    match given {
        Some(h) => h.to_string(),
        None => {
            let port = s.config.opensandbox.port.unwrap_or_default();
            std::net::SocketAddr::new(s.config.server.host, port).to_string()
        }
    }
}

/// `POST /v1/metrics/events`: the SDK's telemetry of its own creates, taken and dropped.
pub async fn telemetry() -> Response {
    StatusCode::NO_CONTENT.into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_are_kubernetes() {
        assert_eq!(cpus("1").ok(), Some(1.0));
        assert_eq!(cpus("500m").ok(), Some(0.5));
        assert!(cpus("0").is_err() && cpus("x").is_err() && cpus("-1").is_err());
        assert_eq!(bytes("2Gi").ok(), Some(2 << 30));
        assert_eq!(bytes("512Mi").ok(), Some(512 << 20));
        assert_eq!(bytes("1G").ok(), Some(1_000_000_000));
        assert_eq!(bytes("1000").ok(), Some(1000));
        assert!(bytes("lots").is_err() && bytes("0").is_err());
    }

    #[test]
    fn an_entrypoint_is_quoted_for_the_shell() {
        assert_eq!(shell_quote("echo"), "'echo'");
        assert_eq!(shell_quote("FOO=1"), "'FOO=1'");
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
        assert_eq!(shell_quote(""), "''");
    }
}
