//! daiv-sandbox control plane: a REST API that runs agents' commands in per-session containers.
//!
//! # Layout
//! - [`config`]: `DAIV_SANDBOX_*` settings, validated all at once at start-up.
//! - [`api`]: wire types, shaped like the reference's.
//! - [`routes`]: thin axum handlers; [`auth`] guards them with `X-API-Key`.
//! - [`session`]: session lifecycle and command execution over the engine seam.
//! - [`engine`]: the [`engine::ContainerEngine`] trait, its Docker implementation and a fake.
//! - [`lock`]: per-session locks (in-process; Redis is a later backend behind the same trait).
//! - [`error`]: the one place errors become HTTP statuses.

use std::sync::Arc;

use axum::Router;
use axum::middleware;
use axum::routing::{get, post};
use utoipa::OpenApi;

pub mod api;
pub mod auth;
pub mod config;
pub mod engine;
pub mod error;
pub mod lock;
pub mod routes;
pub mod session;

use config::Config;
use engine::ContainerEngine;
use error::ApiError;
use lock::{LockError, LockGuard, SessionLocks};
use session::Sessions;

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub sessions: Arc<Sessions>,
    pub locks: Arc<dyn SessionLocks>,
}

impl AppState {
    pub fn new(
        config: Arc<Config>,
        engine: Arc<dyn ContainerEngine>,
        locks: Arc<dyn SessionLocks>,
    ) -> Self {
        Self {
            sessions: Arc::new(Sessions::new(engine, config.clone())),
            config,
            locks,
        }
    }

    /// The session's lock, or 409 once `SESSION_LOCK_WAIT_SECONDS` have passed.
    pub async fn lock(&self, session_id: &str) -> Result<LockGuard, ApiError> {
        self.locks
            .acquire(session_id, self.config.session_lock_wait)
            .await
            .map_err(|e| match e {
                LockError::Timeout => ApiError::Busy,
                LockError::Unavailable(m) => ApiError::Unavailable(m),
            })
    }
}

#[derive(OpenApi)]
#[openapi(
    info(title = "DAIV Runtime Sandbox", description = "Run commands in isolated per-session containers."),
    paths(
        routes::session::create,
        routes::session::run,
        routes::session::status,
        routes::session::close,
        routes::meta::health,
        routes::meta::version,
    ),
    modifiers(&ApiKeyScheme),
)]
pub struct ApiDoc;

struct ApiKeyScheme;

impl utoipa::Modify for ApiKeyScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::new("X-API-Key"))),
        );
    }
}

/// Registers `path` with and without its trailing slash: clients use both, and redirects would
/// turn a POST into a GET in some of them.
fn both<S: Clone + Send + Sync + 'static>(
    router: Router<S>,
    path: &str,
    method: axum::routing::MethodRouter<S>,
) -> Router<S> {
    let bare = path.trim_end_matches('/');
    let slashed = format!("{bare}/");
    router.route(bare, method.clone()).route(&slashed, method)
}

/// The whole HTTP surface; tests drive it in-process with a fake engine.
pub fn app(state: AppState) -> Router {
    use routes::{meta, session};

    let mut api = Router::new();
    api = both(api, "/session/", post(session::create));
    api = both(
        api,
        "/session/{session_id}/",
        get(session::status)
            .post(session::run)
            .delete(session::close),
    );
    let api = api.route_layer(middleware::from_fn_with_state(
        state.clone(),
        auth::require_api_key,
    ));

    let mut open = Router::new();
    open = both(open, "/-/health/", get(meta::health));
    open = both(open, "/-/version/", get(meta::version));
    open = open.route("/openapi.json", get(meta::openapi));

    let prefix = state.config.api_v1_str.clone();
    let versioned = api.merge(open.clone());
    let router = if prefix.is_empty() {
        versioned
    } else {
        // Health and version also answer at the root, where orchestrators probe them.
        Router::new().nest(&prefix, versioned).merge(open)
    };
    router
        .layer(tower_http::trace::TraceLayer::new_for_http())
        .with_state(state)
}
