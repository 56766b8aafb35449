//! OpenSandbox's API over this service, so a program written against OpenSandbox's SDK runs
//! here with only `OPEN_SANDBOX_DOMAIN` and `OPEN_SANDBOX_API_KEY` changed. One listener of its
//! own (`DAIV_SANDBOX_OPENSANDBOX_PORT`) serves its lifecycle API under `/v1` and, at the
//! endpoints that API answers, each sandbox's execd (`/execd/{id}/...`, its token in the
//! endpoint's headers, which the SDK sends on every execd call).
//!
//! It is a translation and nothing else, as E2B's door is: every call decodes into the
//! operations the native routes apply ([`crate::ops`]), so admission, the session lock, the
//! running check and the error classes are the native API's; OpenSandbox's answers and its
//! `{code, message}` refusals are rendered here. A JSON body is bounded by axum's default (2 MB);
//! an upload streams, bounded by the native write.
//!
//! # Layout
//! - [`lifecycle`]: `/v1/sandboxes...` (create, get, list, kill, pause, resume, renew, metadata,
//!   endpoints) and the SDK's telemetry.
//! - [`execd`]: `/ping`, commands as server-sent events (foreground and background, status,
//!   logs, interrupt), files and directories, metrics.
//! - [`shell`]: execd's stateful bash sessions, one long-lived shell each.
//! - [`snapshots`]: `/v1/sandboxes/{id}/snapshots` and `/v1/snapshots...`.

pub mod egress;
pub mod execd;
pub mod lifecycle;
pub mod ports;
pub mod shell;
pub mod snapshots;

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{any, delete, get, patch, post};
use serde_json::{Value, json};

use crate::config::Config;
use crate::error::ApiError;

/// The header OpenSandbox's SDK sends the API key in.
pub const API_KEY_HEADER: &str = "open-sandbox-api-key";
/// The header execd takes its access token in (the endpoint's `headers` carry it).
pub const EXECD_TOKEN_HEADER: &str = "x-execd-access-token";
/// The header the egress sidecar's API takes its token in (its endpoint's `headers`).
pub const EGRESS_TOKEN_HEADER: &str = "opensandbox-egress-auth";
/// The header a sandbox's own port takes its token in (its endpoint's `headers`).
pub const PORT_TOKEN_HEADER: &str = "opensandbox-port-auth";
/// Keep each purpose's tokens apart from the others' and from anything else the key signs
/// (E2B's envd tokens among them): a port's endpoint given to a browser runs no command and
/// edits no policy.
const TOKEN_LABEL: &[u8] = b"daiv-sandbox opensandbox execd token v1\0";
const EGRESS_TOKEN_LABEL: &[u8] = b"daiv-sandbox opensandbox egress token v1\0";
const PORT_TOKEN_LABEL: &[u8] = b"daiv-sandbox opensandbox port token v1\0";
/// execd's port in OpenSandbox's sandboxes.
pub const EXECD_PORT: u16 = 44772;
/// The egress sidecar's port in OpenSandbox's sandboxes.
pub const EGRESS_PORT: u16 = 18080;

/// The door's state: the operations, the settings, the tokens.
#[derive(Clone)]
pub struct OpenSandbox {
    pub config: Arc<Config>,
    pub ops: crate::ops::Ops,
    /// execd's per-sandbox tokens.
    pub tokens: crate::auth::SandboxTokens,
    /// The egress sidecar API's per-sandbox tokens.
    pub egress_tokens: crate::auth::SandboxTokens,
    /// Per sandbox and port (`{id}:{port}`): what reaches one server of the sandbox's.
    pub port_tokens: crate::auth::SandboxTokens,
    /// Runs of a bash session, one at a time.
    pub runs: shell::Runs,
}

impl OpenSandbox {
    /// `op` applied to sandbox `id`; a paused sandbox stays paused (OpenSandbox's is not
    /// running until `resume`), so execd answers it as not running.
    pub async fn reach<O: crate::ops::Op>(&self, id: &str, op: O) -> Result<O::Output, Failure> {
        let id = session_id(id)?;
        Ok(self.ops.apply_keeping_paused(&id, op, true).await?)
    }
}

/// A page of a list as OpenSandbox's lists answer it: its `items` and the five keys of
/// `pagination` the SDK reads (every one present).
pub fn paged(items: Vec<Value>, page: usize, size: usize, total: usize) -> Response {
    let pages = total.div_ceil(size);
    Json(json!({
        "items": items,
        "pagination": {
            "page": page,
            "pageSize": size,
            "totalItems": total,
            "totalPages": pages,
            "hasNextPage": page < pages,
        },
    }))
    .into_response()
}

/// What a port token signs: the sandbox and the port.
pub fn port_subject(id: &str, port: &str) -> String {
    format!("{id}:{port}")
}

/// A sandbox id as the session id it names: one that cannot be a session's is not found, as an
/// unknown one is.
pub fn session_id(id: &str) -> Result<crate::ids::SessionId, Failure> {
    crate::ids::SessionId::parse(id).map_err(|_| Failure::from(ApiError::NotFound))
}

/// A refusal as OpenSandbox's servers answer one: `{code, message}` with its status (the SDK
/// reads both keys into its `SandboxApiException`).
#[derive(Debug)]
pub struct Failure {
    pub status: StatusCode,
    pub code: &'static str,
    pub message: String,
}

impl Failure {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            code: code_of(status),
            message: message.into(),
        }
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, message)
    }
}

/// The `code` of a refusal of `status`.
fn code_of(status: StatusCode) -> &'static str {
    match status {
        StatusCode::BAD_REQUEST | StatusCode::UNPROCESSABLE_ENTITY => "INVALID_ARGUMENT",
        StatusCode::UNAUTHORIZED => "UNAUTHORIZED",
        StatusCode::FORBIDDEN => "FORBIDDEN",
        StatusCode::NOT_FOUND => "NOT_FOUND",
        StatusCode::CONFLICT => "CONFLICT",
        StatusCode::GONE => "GONE",
        StatusCode::PAYLOAD_TOO_LARGE => "PAYLOAD_TOO_LARGE",
        StatusCode::RANGE_NOT_SATISFIABLE => "INVALID_RANGE",
        StatusCode::TOO_MANY_REQUESTS => "RATE_LIMITED",
        StatusCode::NOT_IMPLEMENTED => "NOT_IMPLEMENTED",
        StatusCode::SERVICE_UNAVAILABLE => "UNAVAILABLE",
        _ => "INTERNAL_ERROR",
    }
}

/// An operation's error class as OpenSandbox's doors refuse it (logged as the native route
/// logs it), in the native words.
impl From<ApiError> for Failure {
    fn from(e: ApiError) -> Self {
        e.log();
        let paused = matches!(e, ApiError::Paused);
        let mut f = Self::new(e.status(), e.to_string());
        if paused {
            f.message = "the sandbox is paused: it runs nothing until it is resumed".into();
        }
        f
    }
}

impl IntoResponse for Failure {
    fn into_response(self) -> Response {
        (
            self.status,
            Json(json!({ "code": self.code, "message": self.message })),
        )
            .into_response()
    }
}

pub type Answer = Result<Response, Failure>;

/// OpenSandbox's API over the operations on sessions ([`crate::ops`]); its requests observed as
/// the OpenSandbox door's (`metrics`).
pub fn router(
    config: Arc<Config>,
    ops: crate::ops::Ops,
    metrics: &Arc<crate::telemetry::metrics::Metrics>,
) -> Router {
    use crate::routes::observe::{Door, observed};
    let state = OpenSandbox {
        tokens: crate::auth::SandboxTokens::new(config.server.api_key.expose(), TOKEN_LABEL),
        egress_tokens: crate::auth::SandboxTokens::new(
            config.server.api_key.expose(),
            EGRESS_TOKEN_LABEL,
        ),
        port_tokens: crate::auth::SandboxTokens::new(
            config.server.api_key.expose(),
            PORT_TOKEN_LABEL,
        ),
        config,
        ops,
        runs: shell::Runs::default(),
    };
    let lifecycle = Router::new()
        .route(
            "/v1/sandboxes",
            post(lifecycle::create).get(lifecycle::list),
        )
        .route(
            "/v1/sandboxes/{id}",
            get(lifecycle::get).delete(lifecycle::kill),
        )
        .route("/v1/sandboxes/{id}/pause", post(lifecycle::pause))
        .route("/v1/sandboxes/{id}/resume", post(lifecycle::resume))
        .route(
            "/v1/sandboxes/{id}/renew-expiration",
            post(lifecycle::renew),
        )
        .route("/v1/sandboxes/{id}/metadata", patch(lifecycle::metadata))
        .route(
            "/v1/sandboxes/{id}/endpoints/{port}",
            get(lifecycle::endpoint),
        )
        .route("/v1/metrics/events", post(lifecycle::telemetry))
        .route("/v1/sandboxes/{id}/snapshots", post(snapshots::create))
        .route("/v1/snapshots", get(snapshots::list))
        .route(
            "/v1/snapshots/{id}",
            get(snapshots::get).delete(snapshots::delete),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            lifecycle::require_key,
        ));
    let execd = Router::new()
        .route("/execd/{id}/ping", get(execd::ping))
        .route(
            "/execd/{id}/command",
            post(execd::command).delete(execd::interrupt),
        )
        .route("/execd/{id}/command/status/{cmd}", get(execd::status))
        .route("/execd/{id}/command/{cmd}/logs", get(execd::logs))
        .route("/execd/{id}/files/upload", post(execd::upload))
        .route("/execd/{id}/files/download", get(execd::download))
        .route("/execd/{id}/files/info", get(execd::info))
        .route("/execd/{id}/files/search", get(execd::search))
        .route("/execd/{id}/files/mv", post(execd::rename))
        .route("/execd/{id}/files/permissions", post(execd::chmod))
        .route("/execd/{id}/files/replace", post(execd::replace))
        .route("/execd/{id}/files", delete(execd::remove))
        .route(
            "/execd/{id}/directories",
            post(execd::mkdirs).delete(execd::remove),
        )
        .route("/execd/{id}/directories/list", get(execd::list))
        .route("/execd/{id}/metrics", get(execd::metrics))
        .route("/execd/{id}/session", post(shell::create))
        .route("/execd/{id}/session/{sid}", delete(shell::delete))
        .route("/execd/{id}/session/{sid}/run", post(shell::run))
        .route("/ports/{id}/{port}", any(ports::relay_root))
        .route("/ports/{id}/{port}/{*path}", any(ports::relay))
        .route(
            "/egress/{id}/policy",
            get(egress::get_policy)
                .patch(egress::patch_policy)
                .delete(egress::delete_policy),
        )
        .route(
            "/egress/{id}/credential-vault",
            post(egress::create_vault)
                .get(egress::get_vault)
                .patch(egress::patch_vault)
                .delete(egress::delete_vault),
        )
        .route(
            "/egress/{id}/credential-vault/credentials",
            get(egress::list_credentials),
        )
        .route(
            "/egress/{id}/credential-vault/credentials/{name}",
            get(egress::get_credential),
        )
        .route(
            "/egress/{id}/credential-vault/bindings",
            get(egress::list_bindings),
        )
        .route(
            "/egress/{id}/credential-vault/bindings/{name}",
            get(egress::get_binding),
        )
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            require_token,
        ));
    let served = lifecycle.merge(execd).fallback(|| async {
        Failure::new(
            StatusCode::NOT_FOUND,
            "no such route in OpenSandbox's API as this service serves it",
        )
    });
    observed(served, metrics, "", Door::OpenSandbox).with_state(state)
}

/// Every route under a sandbox's endpoints: the token of that endpoint's purpose (execd's,
/// the egress API's, or one port's), in the header its `headers` name, checked before anything
/// is looked up, so a wrong one learns nothing of the sandbox, and one purpose's token opens no
/// other (a port given to a browser runs no command and edits no policy).
async fn require_token(
    State(s): State<OpenSandbox>,
    Path(params): Path<std::collections::HashMap<String, String>>,
    req: axum::extract::Request,
    next: axum::middleware::Next,
) -> Answer {
    let (ok, what) = checked(&s, &params, &req);
    if !ok {
        return Err(Failure::new(
            StatusCode::UNAUTHORIZED,
            format!("invalid or missing {what}, as the sandbox's endpoint gives it)"),
        ));
    }
    Ok(next.run(req).await)
}

/// Whether `req` carries the token its path's purpose takes, and that token's name.
fn checked(
    s: &OpenSandbox,
    params: &std::collections::HashMap<String, String>,
    req: &axum::extract::Request,
) -> (bool, &'static str) {
    let id = params.get("id").map(String::as_str).unwrap_or("");
    let given = |header: &str| {
        req.headers()
            .get(header)
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .to_string()
    };
    let path = req.uri().path();
    if path.starts_with("/egress/") {
        (
            s.egress_tokens.check(id, &given(EGRESS_TOKEN_HEADER)),
            "egress token (OPENSANDBOX-EGRESS-AUTH",
        )
    } else if path.starts_with("/ports/") {
        let port = params.get("port").map(String::as_str).unwrap_or("");
        (
            s.port_tokens
                .check(&port_subject(id, port), &given(PORT_TOKEN_HEADER)),
            "port token (OPENSANDBOX-PORT-AUTH",
        )
    } else {
        (
            s.tokens.check(id, &given(EXECD_TOKEN_HEADER)),
            "execd access token (X-EXECD-ACCESS-TOKEN",
        )
    }
}
