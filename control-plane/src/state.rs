//! Composition: what the service is made of, and its HTTP surface over it.

use std::sync::Arc;

use crate::shared_file::SharedFile;
use axum::Router;
use axum::extract::FromRef;

use crate::admission::Admission;
use crate::config::Config;
use crate::coordination::activity::{LocalActivity, SessionActivity};
use crate::coordination::lock::SessionLocks;
use crate::engine::ContainerEngine;
use crate::engine::metered::MeteredEngine;
use crate::fleet::{Connector, Fleet};
use crate::telemetry::metrics::Metrics;
use crate::telemetry::runtime_probe::RuntimeHealth;

/// Everything a request or a background task reaches, built once.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    /// Every engine sessions may be on, each with its own stack.
    pub fleet: Arc<Fleet>,
    pub metrics: Arc<Metrics>,
    /// The slots of the create, seed and fs routes.
    pub admission: Arc<Admission>,
    /// What the probes found of the sandboxes' runtime (the fleet's, shared by its engines).
    pub runtime: Arc<RuntimeHealth>,
    /// Every session's connections to its ports (ingress).
    pub ports: Arc<crate::ops::ports::PortStreams>,
}

impl AppState {
    /// The service over `engine`, with in-process activity tracking (one instance), and no
    /// helper binary to give sandboxes: the in-process tests' (their fake engine answers the
    /// helper's calls from a host build of it).
    pub fn new(
        config: Arc<Config>,
        engine: Arc<dyn ContainerEngine>,
        locks: Arc<dyn SessionLocks>,
    ) -> Self {
        let activity = Arc::new(LocalActivity::new(config.reaper.running_session_max_idle));
        Self::with_coordination(config, engine, locks, activity, None)
    }

    /// The service over `engine`, with the locks and activity records replicas share (Redis).
    /// `helper` is the binary every sandbox gets, read once at start-up (`serve`) and shared by
    /// every build.
    pub fn with_coordination(
        config: Arc<Config>,
        engine: Arc<dyn ContainerEngine>,
        locks: Arc<dyn SessionLocks>,
        activity: Arc<dyn SessionActivity>,
        helper: Option<SharedFile>,
    ) -> Self {
        let metrics = Arc::new(Metrics::default());
        // Every engine call is counted and timed, whichever handler or task makes it.
        let engine: Arc<dyn ContainerEngine> =
            Arc::new(MeteredEngine::new(engine, metrics.clone()));
        let fleet = Fleet::single(
            config.clone(),
            engine,
            locks,
            activity,
            metrics.clone(),
            helper,
        );
        Self::over(config, fleet, metrics)
    }

    /// The service over the engines of `ENGINES_FILE` (see [`crate::fleet`]), reached through
    /// `connector` (Docker's in the service, fakes in tests); `helper` as for
    /// [`AppState::with_coordination`].
    pub fn with_fleet(
        config: Arc<Config>,
        locks: Arc<dyn SessionLocks>,
        activity: Arc<dyn SessionActivity>,
        connector: Arc<dyn Connector>,
        helper: Option<SharedFile>,
    ) -> Self {
        let metrics = Arc::new(Metrics::default());
        let fleet = Fleet::from_file(
            config.clone(),
            locks,
            activity,
            metrics.clone(),
            helper,
            connector,
        );
        Self::over(config, fleet, metrics)
    }

    fn over(config: Arc<Config>, fleet: Arc<Fleet>, metrics: Arc<Metrics>) -> Self {
        Self {
            admission: Arc::new(Admission::new(&config.admission, metrics.clone())),
            runtime: fleet.runtime_health().clone(),
            config,
            fleet,
            metrics,
            ports: Arc::default(),
        }
    }
}

impl AppState {
    /// The door to the sessions every front door goes through.
    pub fn ops(&self) -> crate::ops::Ops {
        crate::ops::Ops::new(
            self.fleet.clone(),
            self.admission.clone(),
            self.ports.clone(),
        )
    }
}

impl FromRef<AppState> for Arc<Fleet> {
    fn from_ref(state: &AppState) -> Self {
        state.fleet.clone()
    }
}

impl FromRef<AppState> for Arc<RuntimeHealth> {
    fn from_ref(state: &AppState) -> Self {
        state.runtime.clone()
    }
}

impl FromRef<AppState> for crate::ops::Ops {
    fn from_ref(state: &AppState) -> Self {
        state.ops()
    }
}

impl FromRef<AppState> for Arc<Admission> {
    fn from_ref(state: &AppState) -> Self {
        state.admission.clone()
    }
}

impl FromRef<AppState> for Arc<Config> {
    fn from_ref(state: &AppState) -> Self {
        state.config.clone()
    }
}

/// The whole HTTP surface over `state`; tests drive it in-process with a fake engine.
/// Every door on this listener (the REST API and `/mcp`) is inside the request observer and the
/// panic catcher, its traffic labelled by door.
pub fn app(state: AppState) -> Router {
    use crate::routes::observe::{Door, observed};
    let prefix = &state.config.server.api_v1_str;
    let mcp = crate::mcp::router(&state.config, &state.ops());
    let main = crate::routes::router(&state.config, &state.metrics)
        .merge(observed(mcp, &state.metrics, prefix, Door::Mcp))
        .with_state(state.clone());
    if state.config.ingress.preview_domain.is_none() {
        return main;
    }
    // `{port}-{id}.{domain}`: every path of such a host is the sandbox's server's.
    let domain = state
        .config
        .ingress
        .preview_domain
        .clone()
        .unwrap_or_default();
    let preview = observed(
        Router::new().fallback(preview_host),
        &state.metrics,
        "",
        Door::Ingress,
    )
    .with_state(state);
    Router::new().fallback_service(tower::service_fn(move |req: axum::extract::Request| {
        let to = match req.headers().get(axum::http::header::HOST) {
            Some(h)
                if h.to_str()
                    .ok()
                    .and_then(|h| crate::routes::ports::host_label(h, &domain))
                    .is_some() =>
            {
                preview.clone()
            }
            _ => main.clone(),
        };
        async move {
            use tower::ServiceExt;
            Ok::<_, std::convert::Infallible>(match to.oneshot(req).await {
                Ok(r) => r,
                Err(never) => match never {},
            })
        }
    }))
}

/// A request to a preview host: the session and port it names, its whole path theirs.
async fn preview_host(
    axum::extract::State(state): axum::extract::State<AppState>,
    req: axum::extract::Request,
) -> axum::response::Response {
    let ops = state.ops();
    match crate::routes::ports::preview_host(&ops, &state.config, req.headers()).await {
        Some(Ok((id, port))) => {
            crate::routes::ports::serve_host(ops, state.config.clone(), id, port, req, false).await
        }
        Some(Err(e)) => crate::routes::render::respond(e),
        None => crate::routes::render::respond(crate::error::ApiError::NotFound),
    }
}
