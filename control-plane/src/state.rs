//! Composition: what the service is made of, and its HTTP surface over it.

use std::sync::Arc;

use axum::Router;
use axum::extract::FromRef;

use crate::admission::Admission;
use crate::config::Config;
use crate::coordination::activity::{LocalActivity, SessionActivity};
use crate::coordination::lock::SessionLocks;
use crate::egress::Egress;
use crate::engine::ContainerEngine;
use crate::pool::Pool;
use crate::runtime::{HelperRuntime, SessionRuntime, helper_binary};
use crate::sandbox::SandboxFactory;
use crate::sessions::Sessions;
use crate::telemetry::engine::MeteredEngine;
use crate::telemetry::metrics::Metrics;

/// Everything a request or a background task reaches, built once.
#[derive(Clone)]
pub struct AppState {
    pub config: Arc<Config>,
    pub sessions: Arc<Sessions>,
    /// The engine every call goes through (counted and timed).
    pub engine: Arc<dyn ContainerEngine>,
    pub runtime: Arc<dyn SessionRuntime>,
    pub metrics: Arc<Metrics>,
    /// The slots of the create, seed and fs routes.
    pub admission: Arc<Admission>,
}

impl AppState {
    /// The service over `engine`, with in-process activity tracking (one instance).
    pub fn new(
        config: Arc<Config>,
        engine: Arc<dyn ContainerEngine>,
        locks: Arc<dyn SessionLocks>,
    ) -> Self {
        let activity = Arc::new(LocalActivity::new(config.reaper.running_session_max_idle));
        Self::with_coordination(config, engine, locks, activity)
    }

    /// The service over `engine`, with the locks and activity records replicas share (Redis).
    pub fn with_coordination(
        config: Arc<Config>,
        engine: Arc<dyn ContainerEngine>,
        locks: Arc<dyn SessionLocks>,
        activity: Arc<dyn SessionActivity>,
    ) -> Self {
        let metrics = Arc::new(Metrics::default());
        // Every engine call is counted and timed, whichever handler or task makes it.
        let engine: Arc<dyn ContainerEngine> =
            Arc::new(MeteredEngine::new(engine, metrics.clone()));
        // A CA file that cannot be read was already refused by config validation; reading it
        // again here can only fail on a race, which then disables egress loudly.
        let egress = match Egress::load(engine.clone(), config.clone()) {
            Ok(e) => e.map(Arc::new),
            Err(e) => {
                tracing::error!(error = %e, "egress CA unreadable; egress sessions disabled");
                None
            }
        };
        // main checks for the helper before serving; in-process tests run without one.
        let helper = helper_binary(config.sessions.helper_bin.as_deref()).ok();
        let runtime: Arc<dyn SessionRuntime> = Arc::new(
            HelperRuntime::new(
                engine.clone(),
                config.sessions.run_uid,
                config.sessions.run_gid,
            )
            .with_helper(helper.clone()),
        );
        let factory = Arc::new(SandboxFactory::new(
            engine.clone(),
            config.clone(),
            egress,
            helper,
        ));
        let pool = Arc::new(Pool::new(factory.clone(), runtime.clone(), metrics.clone()));
        let sessions = Arc::new(Sessions::new(
            factory,
            pool,
            runtime.clone(),
            locks,
            activity,
            metrics.clone(),
        ));
        Self {
            admission: Arc::new(Admission::new(&config.admission, metrics.clone())),
            config,
            sessions,
            engine,
            runtime,
            metrics,
        }
    }
}

impl FromRef<AppState> for Arc<Sessions> {
    fn from_ref(state: &AppState) -> Self {
        state.sessions.clone()
    }
}

impl FromRef<AppState> for Arc<Config> {
    fn from_ref(state: &AppState) -> Self {
        state.config.clone()
    }
}

/// The whole HTTP surface over `state`; tests drive it in-process with a fake engine.
pub fn app(state: AppState) -> Router {
    crate::routes::router(&state.config, &state.metrics, &state.admission).with_state(state)
}
