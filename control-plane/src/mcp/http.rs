//! `/mcp` over HTTP: rmcp's streamable HTTP service (stateful sessions in this process, or
//! stateless), behind the deployment's API key (`X-API-Key` or `Authorization: Bearer`), a
//! request body bound and the SDK's DNS-rebinding guard (allowed `Host` and `Origin` values).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::streamable_http_server::{StreamableHttpServerConfig, StreamableHttpService};
use subtle::ConstantTimeEq;

use super::{McpServer, Tools};
use crate::admission::Admission;
use crate::api::ErrorBody;
use crate::config::Config;
use crate::fleet::Fleet;

/// The path the endpoint answers at (and under the API prefix).
pub const PATH: &str = "/mcp";

/// `/mcp` and `{API_V1_STR}/mcp`, over `fleet` and `admission` (the state's own).
pub fn router<S: Clone + Send + Sync + 'static>(
    config: &Arc<Config>,
    fleet: &Arc<Fleet>,
    admission: &Arc<Admission>,
) -> Router<S> {
    let tools = Arc::new(Tools {
        fleet: fleet.clone(),
        admission: admission.clone(),
        config: config.clone(),
    });
    let server = McpServer::new(tools);
    let service: StreamableHttpService<McpServer, LocalSessionManager> = StreamableHttpService::new(
        move || Ok(server.clone()),
        Arc::new(LocalSessionManager::default()),
        transport_config(config),
    );
    let mcp = Router::new()
        .nest_service(PATH, service)
        // A route layer: merged into the API's router, a plain layer would also guard its
        // fallback, and an unknown path would answer 401 instead of 404.
        .route_layer(middleware::from_fn_with_state(config.clone(), guard));
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
/// included, is shown before it) and a body that says it is too large (413 before reading it;
/// the SDK bounds the rest as it reads).
async fn guard(State(config): State<Arc<Config>>, req: Request, next: Next) -> Response {
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
    let Some(given) = given else {
        let mut r = refuse(
            StatusCode::UNAUTHORIZED,
            "API key is missing: send it as X-API-Key or Authorization: Bearer",
        );
        r.headers_mut().insert(
            header::WWW_AUTHENTICATE,
            HeaderValue::from_static("Bearer realm=\"daiv-sandbox\""),
        );
        return r;
    };
    let expected = config.server.api_key.expose().as_bytes();
    if !bool::from(given.ct_eq(expected)) {
        return refuse(StatusCode::FORBIDDEN, "Invalid API Key");
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
    next.run(req).await
}

fn refuse(status: StatusCode, detail: &str) -> Response {
    (
        status,
        axum::Json(ErrorBody {
            detail: detail.to_string(),
        }),
    )
        .into_response()
}
