//! `/mcp` over HTTP: rmcp's streamable HTTP service (stateful sessions in this process, at most
//! `MCP_MAX_SESSIONS` of them, or stateless), behind the deployment's API key (`X-API-Key` or
//! `Authorization: Bearer`), a request body bound and the SDK's DNS-rebinding guard (allowed
//! `Host` and `Origin` values).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};

use super::sessions::McpSessions;
use super::{McpServer, Tools};
use crate::api::ErrorBody;
use crate::config::Config;

/// The path the endpoint answers at (and under the API prefix).
pub const PATH: &str = "/mcp";

/// The header naming a request's MCP session.
const SESSION_HEADER: &str = "mcp-session-id";

/// What a 503 for a new session asks the client to wait: a slot comes free when a busy
/// session's call or stream ends, which is rarely at once.
const FULL_RETRY_AFTER_SECONDS: u64 = 10;

/// What the key check and the session cap need.
#[derive(Clone)]
struct Guard {
    config: Arc<Config>,
    /// `None` in the stateless mode (no sessions).
    sessions: Option<McpSessions>,
}

/// `/mcp` and `{API_V1_STR}/mcp`, over `fleet` and `admission` (the state's own).
pub fn router<S: Clone + Send + Sync + 'static>(
    config: &Arc<Config>,
    ops: &crate::ops::Ops,
) -> Router<S> {
    let tools = Arc::new(Tools {
        ops: ops.clone(),
        config: config.clone(),
    });
    let server = McpServer::new(tools);
    let sessions = McpSessions::new(&config.mcp);
    let service: StreamableHttpService<McpServer, McpSessions> = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(sessions.clone()),
        transport_config(config),
    );
    let state = Guard {
        config: config.clone(),
        sessions: (!config.mcp.stateless).then_some(sessions),
    };
    let mcp = Router::new()
        .nest_service(PATH, service)
        // A route layer: merged into the API's router, a plain layer would also guard its
        // fallback, and an unknown path would answer 401 instead of 404.
        .route_layer(middleware::from_fn_with_state(state, guard));
    let prefix = &config.server.api_v1_str;
    if prefix.is_empty() {
        mcp
    } else {
        Router::new().nest(prefix, mcp.clone()).merge(mcp)
    }
}

/// The SDK's settings from ours.
pub fn transport_config(config: &Config) -> StreamableHttpServerConfig {
    let mcp = &config.mcp;
    let mut c = StreamableHttpServerConfig::default()
        .with_legacy_session_mode(!mcp.stateless)
        // Stateless answers are plain JSON unless the call sends progress first.
        .with_json_response(mcp.stateless)
        .with_max_request_body_bytes(mcp.max_request_bytes);
    c = if mcp.any_host() {
        c.disable_allowed_hosts()
    } else {
        c.with_allowed_hosts(mcp.allowed_hosts.clone())
    };
    if mcp.any_origin() {
        c.disable_allowed_origins()
    } else {
        c.with_allowed_origins(mcp.allowed_origins.clone())
            .enforce_origin_validation()
    }
}

/// The key check (401 without a key, 403 with a wrong one: nothing of the server, its tools
/// included, is shown before it), a body that says it is too large (413 before reading it;
/// the SDK bounds the rest as it reads), and a new session when every slot is busy (503 with
/// `Retry-After`; the SDK would make a session manager's refusal a 500).
async fn guard(State(guard): State<Guard>, req: Request, next: Next) -> Response {
    let config = &guard.config;
    let headers = req.headers();
    let given = headers
        .get(crate::auth::HEADER)
        .map(HeaderValue::as_bytes)
        .or_else(|| {
            headers
                .get(header::AUTHORIZATION)
                .and_then(|v| v.to_str().ok())
                .and_then(|v| {
                    let (scheme, token) = v.trim().split_once(' ')?;
                    scheme
                        .eq_ignore_ascii_case("bearer")
                        .then(|| token.trim().as_bytes())
                })
        });
    match crate::auth::check_key(config, given) {
        Ok(()) => {}
        Err(crate::auth::KeyRefusal::Missing) => {
            let mut r = refuse(
                StatusCode::UNAUTHORIZED,
                "API key is missing: send it as X-API-Key or Authorization: Bearer",
            );
            r.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                HeaderValue::from_static("Bearer realm=\"daiv-sandbox\""),
            );
            return r;
        }
        Err(crate::auth::KeyRefusal::Invalid) => {
            return refuse(StatusCode::FORBIDDEN, "Invalid API Key");
        }
    }
    let declared = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > config.mcp.max_request_bytes as u64) {
        return refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            &format!(
                "request body over DAIV_SANDBOX_MCP_MAX_REQUEST_BYTES ({} bytes)",
                config.mcp.max_request_bytes
            ),
        );
    }
    // A POST without a session id opens one (`initialize`; a `server/discover`, answered
    // without a session, waits too when every session is busy).
    let opens_session = req.method() == Method::POST && !req.headers().contains_key(SESSION_HEADER);
    if let Some(sessions) = &guard.sessions
        && opens_session
        && !sessions.admits_new()
    {
        let mut r = refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            &format!(
                "too many MCP sessions in use (at most {}); retry in {FULL_RETRY_AFTER_SECONDS} s",
                config.mcp.max_sessions
            ),
        );
        r.headers_mut().insert(
            header::RETRY_AFTER,
            HeaderValue::from(FULL_RETRY_AFTER_SECONDS),
        );
        return r;
    }
    next.run(req).await
}

fn refuse(status: StatusCode, detail: &str) -> Response {
    (
        status,
        axum::Json(ErrorBody {
            detail: detail.to_string(),
            code: None,
        }),
    )
        .into_response()
}
