//! daiv-sandbox control plane: a REST API that runs agents' commands in per-session containers.
//!
//! # Layout
//! - [`config`]: `DAIV_SANDBOX_*` settings, validated all at once at start-up.
//! - [`api`]: wire types, shaped like the reference's; [`openapi`] adds the document's links
//!   (create → every session route) and the bounds the types cannot say.
//! - [`routes`]: thin axum handlers; [`auth`] guards them with `X-API-Key`; [`admission`] bounds
//!   how many creates, seeds and fs operations are in flight (429 with `Retry-After` past a short
//!   queue), so the service's memory follows its settings, not the size of a burst.
//! - [`session`]: session lifecycle over the engine seam; commands through the runtime; its
//!   errors in `session/error.rs`.
//! - [`egress`]: the egress triad (network, gateway, sandbox wiring): the only code that creates,
//!   restarts, refreshes and tears one down.
//! - [`processes`]: background processes and streaming runs (over the same runtime).
//! - [`runtime`]: the [`runtime::SessionRuntime`] seam (commands, fs ops, seed extraction) and its
//!   implementation over the in-container helper's channel.
//! - [`engine`]: the [`engine::ContainerEngine`] trait, its Docker implementation and a fake.
//! - [`coordination`]: what replicas agree on: per-session locks and when each session was last
//!   used (for idle reaping), in-process or shared through one Redis connection.
//! - [`pool`]: the warm pool: sessions created ahead of requests, claimed atomically.
//! - [`reaper`]: the background sweep that removes expired, surplus, idle and orphaned resources.
//! - [`error`]: the one place the domain's errors (named by cause: [`session::SessionError`],
//!   [`egress::EgressError`], [`runtime::HelperError`], ...) become HTTP statuses and
//!   `{"detail": ...}` bodies; the JSON and query extractors that answer in that shape.
//! - [`telemetry`]: logs, Prometheus metrics and Sentry reports.
//!
//! Plumbing, one place each:
//! - [`layout`]: the paths inside a sandbox (re-exported from the helper crate, which confines
//!   and serves them).
//! - [`archive`]: the tar archives the service builds itself for `put_archive`.
//! - [`backoff`]: the one retry pacing every polling loop uses.

use std::sync::Arc;

use axum::Router;
use axum::middleware;
use axum::routing::{get, post, put};
use utoipa::OpenApi;

pub mod admission;
pub mod api;
pub mod archive;
pub mod auth;
pub mod backoff;
pub mod config;
pub mod coordination;
pub mod egress;
pub mod engine;
pub mod error;
pub mod ids;
pub mod openapi;
pub mod pool;
pub mod processes;
pub mod reaper;
pub mod routes;
pub mod runtime;
pub mod secret;
pub mod session;
pub mod telemetry;
pub mod workspace;

pub use sandbox_protocol::layout;

use config::Config;
use coordination::activity::{self, LocalActivity, SessionActivity};
use coordination::lock::{LockError, LockGuard, SessionLocks};
use engine::ContainerEngine;
use openapi::SessionLinks;
use session::{SessionError, Sessions};

pub const VERSION: &str = env!("CARGO_PKG_VERSION");

/// Longest a force delete waits for a busy session's lock before it removes the session anyway.
pub const FORCE_LOCK_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub sessions: Arc<Sessions>,
    pub locks: Arc<dyn SessionLocks>,
    /// Touched by [`AppState::lock`] at the start and end of every session operation.
    pub activity: Arc<dyn SessionActivity>,
    pub metrics: Arc<telemetry::metrics::Metrics>,
    /// The slots of the create, seed and fs routes.
    pub admission: Arc<admission::Admission>,
}

impl AppState {
    pub fn new(
        config: Arc<Config>,
        engine: Arc<dyn ContainerEngine>,
        locks: Arc<dyn SessionLocks>,
    ) -> Self {
        // Every engine call is counted and timed, whichever handler or task makes it.
        let metrics = Arc::new(telemetry::metrics::Metrics::default());
        let engine: Arc<dyn ContainerEngine> = Arc::new(telemetry::engine::MeteredEngine::new(
            engine,
            metrics.clone(),
        ));
        // A CA file that cannot be read was already refused by config validation; reading it
        // again here can only fail on a race, which then disables egress loudly.
        let egress = match egress::Egress::load(engine.clone(), config.clone()) {
            Ok(e) => e,
            Err(e) => {
                tracing::error!(error = %e, "egress CA unreadable; egress sessions disabled");
                None
            }
        };
        // main checks for the helper before serving; in-process tests run without one.
        let helper = runtime::helper_binary(config.sessions.helper_bin.as_deref()).ok();
        Self {
            sessions: Arc::new(Sessions::new(
                engine,
                config.clone(),
                egress,
                helper,
                metrics.clone(),
            )),
            activity: Arc::new(LocalActivity::new(config.reaper.running_session_max_idle)),
            admission: Arc::new(admission::Admission::new(
                &config.admission,
                metrics.clone(),
            )),
            config,
            locks,
            metrics,
        }
    }

    /// Replaces the in-process activity tracker (with the Redis one when `REDIS_URL` is set).
    pub fn with_activity(mut self, activity: Arc<dyn SessionActivity>) -> Self {
        self.activity = activity;
        self
    }

    /// For operations that may overlap a running command (read-only fs ops, background
    /// processes): no lock while the session runs; a stopped session is restarted under its
    /// lock, as every other operation does.
    pub async fn running_unlocked(&self, session_id: &str) -> Result<(), SessionError> {
        let info = self.sessions.find(session_id).await?;
        if info.is_running() && self.sessions.gateway_up(&info).await? {
            self.activity.touch(session_id).await;
            return Ok(());
        }
        let _held = self.lock(session_id).await?;
        self.sessions.ensure_running(session_id).await?;
        Ok(())
    }

    /// The session's lock for a force delete, which does not wait behind anything: taken if
    /// it is free within [`FORCE_LOCK_WAIT`], else the removal goes ahead without it (the
    /// request holding it then fails: its session is gone). Its activity record is deleted.
    pub async fn lock_to_remove(
        &self,
        session_id: &str,
    ) -> Result<Option<LockGuard>, SessionError> {
        let wait = self.config.coordination.lock_wait.min(FORCE_LOCK_WAIT);
        match self.locks.acquire(session_id, wait).await {
            Ok(held) => Ok(Some(activity::forget_on_release(
                self.activity.clone(),
                session_id,
                held,
            ))),
            Err(LockError::Timeout) => {
                tracing::info!(
                    session_id,
                    "force delete of a busy session: removing it anyway"
                );
                self.activity.forget(session_id).await;
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The session's lock, or 409 once `SESSION_LOCK_WAIT_SECONDS` have passed (503 when the
    /// lock backend is down). Touches the session's activity now and again when the guard drops,
    /// before the lock is released.
    pub async fn lock(&self, session_id: &str) -> Result<LockGuard, SessionError> {
        let held = self.acquire(session_id).await?;
        if ids::is_container_id(session_id) {
            self.activity.touch(session_id).await;
        }
        Ok(activity::touch_on_release(
            self.activity.clone(),
            session_id,
            held,
        ))
    }

    async fn acquire(&self, session_id: &str) -> Result<LockGuard, SessionError> {
        let waiting = std::time::Instant::now();
        let held = self
            .locks
            .acquire(session_id, self.config.coordination.lock_wait)
            .await;
        self.metrics.lock_waits.observe(waiting.elapsed());
        if let Err(LockError::Timeout) = &held {
            self.metrics.lock_busy.inc();
        }
        Ok(held?)
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
        routes::egress::refresh,
        routes::seed::seed,
        routes::fs::ls,
        routes::fs::read,
        routes::fs::grep,
        routes::fs::glob,
        routes::fs::write,
        routes::fs::edit,
        routes::fs::delete,
        routes::processes::start,
        routes::processes::list,
        routes::processes::poll,
        routes::processes::stdin,
        routes::processes::kill,
        routes::meta::health,
        routes::meta::version,
    ),
    modifiers(&ApiKeyScheme, &SessionLinks),
)]
pub struct ApiDoc;

/// `X-API-Key`, which the operations that need it name: the docs page's "Authorize" dialog
/// asks for it and its description.
struct ApiKeyScheme;

impl utoipa::Modify for ApiKeyScheme {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        use utoipa::openapi::security::{ApiKey, ApiKeyValue, SecurityScheme};
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "api_key",
            SecurityScheme::ApiKey(ApiKey::Header(ApiKeyValue::with_description(
                "X-API-Key",
                "The service's key (`DAIV_SANDBOX_API_KEY`). Health and version need none.",
            ))),
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
    use routes::{admit, meta, session};

    // Inside the key check (a route layer added below): a request without the key never takes a
    // slot.
    let mut api = Router::new();
    api = both(
        api,
        "/session/",
        post(session::create).layer(middleware::from_fn_with_state(state.clone(), admit::create)),
    );
    api = both(
        api,
        "/session/{session_id}/",
        get(session::status)
            .post(session::run)
            .delete(session::close),
    );
    api = both(
        api,
        "/session/{session_id}/egress/",
        put(routes::egress::refresh),
    );
    // Seeds stream archives of any size: the body limit is SEED_MAX_BYTES, enforced as it flows.
    api = both(
        api,
        "/session/{session_id}/seed/",
        post(routes::seed::seed)
            .layer(axum::extract::DefaultBodyLimit::disable())
            .layer(middleware::from_fn_with_state(state.clone(), admit::seed)),
    );
    for (op, handler) in [
        ("ls", post(routes::fs::ls)),
        ("read", post(routes::fs::read)),
        ("grep", post(routes::fs::grep)),
        ("glob", post(routes::fs::glob)),
        ("write", post(routes::fs::write)),
        ("edit", post(routes::fs::edit)),
        ("delete", post(routes::fs::delete)),
    ] {
        api = both(
            api,
            &format!("/session/{{session_id}}/fs/{op}/"),
            handler.layer(middleware::from_fn_with_state(state.clone(), admit::fs)),
        );
    }
    api = both(
        api,
        "/session/{session_id}/processes/",
        post(routes::processes::start).get(routes::processes::list),
    );
    api = both(
        api,
        "/session/{session_id}/processes/{process_id}/",
        get(routes::processes::poll).delete(routes::processes::kill),
    );
    api = both(
        api,
        "/session/{session_id}/processes/{process_id}/stdin",
        post(routes::processes::stdin),
    );
    let api = api.route_layer(middleware::from_fn_with_state(
        state.clone(),
        auth::require_api_key,
    ));

    let mut open = Router::new();
    open = both(open, "/-/health/", get(meta::health));
    open = both(open, "/-/version/", get(meta::version));
    open = open.route("/openapi.json", get(meta::openapi));
    // Swagger UI at `/docs` (no trailing slash: it names `openapi.json` and its files relatively).
    let open = open.merge(routes::docs::router());

    // Every route answers at the root and under the prefix, as the reference's FastAPI
    // `root_path` does (Starlette strips the root path only from paths that start with it):
    // DAIV's documented URL (`http://sandbox:8000`) has no prefix, other clients use it.
    let surface = api.merge(open);
    let prefix = state.config.server.api_v1_str.clone();
    let router = if prefix.is_empty() {
        surface
    } else {
        Router::new().nest(&prefix, surface.clone()).merge(surface)
    };
    let mut metrics = Router::new().route("/metrics", get(routes::metrics::metrics));
    if !state.config.server.metrics_public {
        metrics = metrics.route_layer(middleware::from_fn_with_state(
            state.clone(),
            auth::require_api_key,
        ));
    }
    // Layers added with `Router::layer` run after routing, so the middleware sees the matched
    // route template. Panics are caught inside it, so a panic is still logged as a 500.
    router
        .merge(metrics)
        .layer(tower_http::catch_panic::CatchPanicLayer::custom(
            routes::observe::panic_response,
        ))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            routes::observe::observe,
        ))
        .with_state(state)
}
