//! E2B's API over this service, so a program written against E2B's SDK runs here with only
//! `E2B_API_KEY`, `E2B_API_URL` and `E2B_SANDBOX_URL` changed. One listener of its own
//! (`DAIV_SANDBOX_E2B_PORT`) serves both of E2B's planes, told apart by the `E2b-Sandbox-Id`
//! header envd calls carry: the control API (sandboxes, their lifetime, metrics, snapshots)
//! and envd (processes, the filesystem, `/files`).
//!
//! It is a translation and nothing else: every call decodes into the operations the native
//! routes apply ([`crate::ops`]), so admission, the session lock, the running check and the
//! error classes are the native API's, taken once; E2B's answers and refusals ([`refusal`]) are
//! rendered here.
//!
//! # Layout
//! - [`control`]: `/sandboxes`, `/v2/sandboxes`, `/snapshots`, `/templates`; [`network`]: E2B's
//!   network settings as an egress policy and secrets.
//! - [`envd`]: `process.Process` and `filesystem.Filesystem` over [`connect`] (the Connect
//!   protocol, JSON codec), `/files` and `/health`; [`token`]: the per-sandbox access token;
//!   [`reset`]: a stream cut short resets its HTTP/1.1 connection, as envd's drops.

pub mod connect;
pub mod control;
pub mod envd;
pub mod network;
pub mod polled;
pub mod ports;
pub mod refusal;
pub mod reset;
pub mod snapshots;
pub mod state;
pub mod token;

use std::convert::Infallible;
use std::sync::Arc;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{delete, get, post, put};
use tower::ServiceExt;

use crate::config::Config;
pub use state::{E2b, ENVD_VERSION};

/// E2B's API over the operations on sessions ([`crate::ops`]); its requests observed as the E2B
/// door's (`metrics`).
pub fn router(
    config: Arc<Config>,
    ops: crate::ops::Ops,
    metrics: &Arc<crate::telemetry::metrics::Metrics>,
) -> Router {
    use crate::routes::observe::{Door, observed};
    let key = config.server.api_key.expose();
    let domain: Option<Arc<str>> = ports::domain(&config).map(Arc::from);
    let state = E2b {
        tokens: token::Tokens::new(key),
        watchers: Arc::default(),
        config,
        ops,
        keep_paused: false,
        live: Arc::default(),
    };
    let control = Router::new()
        .route("/sandboxes", post(control::create).get(control::list))
        .route("/v2/sandboxes", post(control::create).get(control::list))
        .route("/sandboxes/{id}", get(control::get).delete(control::kill))
        .route("/sandboxes/{id}/connect", post(control::connect))
        .route("/v2/sandboxes/{id}/connect", post(control::connect))
        .route("/sandboxes/{id}/resume", post(control::connect))
        .route("/sandboxes/{id}/timeout", post(control::timeout))
        .route("/sandboxes/{id}/pause", post(control::pause))
        .route("/sandboxes/{id}/metrics", get(control::metrics))
        .route("/sandboxes/{id}/fork", post(snapshots::fork))
        .route("/sandboxes/{id}/snapshots", post(snapshots::snapshot))
        .route("/sandboxes/{id}/network", put(control::update_network))
        .route("/snapshots", get(snapshots::snapshots))
        .route("/templates/{id}", delete(snapshots::delete_template))
        .route_layer(axum::middleware::from_fn_with_state(
            state.clone(),
            control::require_key,
        ))
        .fallback(|| async {
            control::ApiFailure(refusal::Refusal::new(
                StatusCode::NOT_FOUND,
                "no such route in E2B's API as this service serves it",
            ))
        });
    let control = observed(control, metrics, "", Door::E2b).with_state(state.clone());
    // envd never thaws a paused sandbox: E2B's is not running until `connect` resumes it.
    let envd_state = E2b {
        keep_paused: true,
        ..state
    };
    let envd = envd::router()
        .layer(DefaultBodyLimit::max(connect::MAX_MESSAGE + 64 * 1024))
        .fallback(|| async {
            connect::RpcError::new(connect::Code::Unimplemented, "no such envd route")
        });
    let ports_state = envd_state.clone();
    let envd = observed(envd, metrics, "", Door::E2b)
        .with_state(envd_state)
        .layer(axum::middleware::from_fn(reset::reset_on_cut));
    // A sandbox's other ports (`get_host(port)`): the relay, as E2B's proxy serves them.
    let ports = observed(
        Router::new().fallback(ports::serve),
        metrics,
        "",
        Door::Ingress,
    )
    .with_state(ports_state);
    Router::new().fallback_service(tower::service_fn(move |req: Request| {
        let (control, envd, ports) = (control.clone(), envd.clone(), ports.clone());
        let domain = domain.clone();
        async move {
            let to = if ports::is_port_request(req.headers(), domain.as_deref()) {
                ports
            } else if req.headers().contains_key("e2b-sandbox-id")
                // A signed `/files` URL comes as its holder has it, without the header: its
                // signature names the sandbox (the control API has no `/files`).
                || req.uri().path() == "/files"
            {
                envd
            } else {
                control
            };
            Ok::<Response, Infallible>(match to.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            })
        }
    }))
}
