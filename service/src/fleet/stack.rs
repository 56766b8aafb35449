//! One engine's stack: what a single-engine service runs (sandbox factory, egress, helper
//! runtime, warm pool and its refill, sessions, reaper), wired here once for the single engine
//! and for each engine of a fleet alike.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use tokio::task::JoinHandle;

use crate::config::Config;
use crate::coordination::activity::SessionActivity;
use crate::coordination::lock::SessionLocks;
use crate::egress::Egress;
use crate::engine::ContainerEngine;
use crate::pool::{Pool, Refill};
use crate::reaper::{self, Reaper};
use crate::runtime::{HelperRuntime, SessionRuntime};
use crate::sandbox::SandboxFactory;
use crate::sessions::Sessions;
use crate::snapshots::Snapshots;
use crate::telemetry::metrics::Metrics;
use crate::telemetry::runtime_probe::{ImageProbes, RuntimeHealth};

/// How long shutting down waits for the image probes still running.
const PROBE_SHUTDOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// What every engine's stack shares: settings, locks and activity (one set for all engines, so
/// a session's lock is the same whichever engine holds it), metrics and the helper binary.
#[derive(Clone)]
pub(super) struct Shared {
    pub config: Arc<Config>,
    pub locks: Arc<dyn SessionLocks>,
    pub activity: Arc<dyn SessionActivity>,
    pub metrics: Arc<Metrics>,
    pub helper: Option<crate::shared_file::SharedFile>,
    /// What the probes of the sandboxes' runtime found, on every engine.
    pub runtime: Arc<RuntimeHealth>,
}

/// The sessions of one engine and the background work that keeps them (its reaper and its warm
/// pool's refill), started once the engine can be used.
pub(super) struct Stack {
    engine: Arc<dyn ContainerEngine>,
    sessions: Arc<Sessions>,
    pool: Arc<Pool>,
    snapshots: Arc<Snapshots>,
    refill: Arc<Refill>,
    reaper: Arc<Reaper>,
    /// The probes of the images its sessions use (under `runsc` only).
    probes: Option<Arc<ImageProbes>>,
    /// Whether the reaper runs (`REAPER_ENABLED`); tests sweep by hand.
    reaping: bool,
    started: AtomicBool,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl Drop for Stack {
    fn drop(&mut self) {
        abort_all(&self.tasks);
    }
}

/// Stops every task in `tasks`.
pub(super) fn abort_all(tasks: &Mutex<Vec<JoinHandle<()>>>) {
    for t in tasks.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
        t.abort();
    }
}

impl Stack {
    /// The stack over `engine` (already metered, and scoped for a fleet's engine).
    pub fn build(engine: Arc<dyn ContainerEngine>, name: &str, shared: &Shared) -> Self {
        let config = shared.config.clone();
        // A CA file that cannot be read was already refused by config validation; reading it
        // again here can only fail on a race, which then disables egress loudly.
        let egress = match Egress::load(engine.clone(), config.clone()) {
            Ok(e) => e.map(Arc::new),
            Err(e) => {
                tracing::error!(engine = %name, error = %e, "egress CA unreadable; egress sessions disabled");
                None
            }
        };
        let runtime: Arc<dyn SessionRuntime> = Arc::new(
            HelperRuntime::new(
                engine.clone(),
                config.sessions.run_uid,
                config.sessions.run_gid,
            )
            .with_helper(shared.helper.clone()),
        );
        let factory = Arc::new(SandboxFactory::new(
            engine.clone(),
            config.clone(),
            egress,
            shared.helper.clone(),
        ));
        let pool = Arc::new(Pool::new(
            factory.clone(),
            runtime.clone(),
            shared.metrics.clone(),
        ));
        let snapshots = factory.snapshots().clone();
        let probes = ImageProbes::new(engine.clone(), config.clone(), name, shared.runtime.clone());
        let sessions = Arc::new(
            Sessions::new(
                factory,
                pool.clone(),
                runtime,
                shared.locks.clone(),
                shared.activity.clone(),
                shared.metrics.clone(),
            )
            .with_image_probes(probes.clone()),
        );
        let reaper = Arc::new(Reaper::new(
            reaper::Parts {
                engine: engine.clone(),
                sessions: sessions.clone(),
                pool: pool.clone(),
                snapshots: snapshots.clone(),
                locks: shared.locks.clone(),
                activity: shared.activity.clone(),
                metrics: shared.metrics.clone(),
            },
            reaper::Policy::from_config(&config),
        ));
        Self {
            engine,
            sessions,
            refill: Refill::new(pool.clone(), shared.locks.clone()),
            pool,
            snapshots,
            reaper,
            probes,
            reaping: config.reaper.enabled,
            started: AtomicBool::new(false),
            tasks: Mutex::default(),
        }
    }

    pub fn sessions(&self) -> &Arc<Sessions> {
        &self.sessions
    }

    pub fn engine(&self) -> &Arc<dyn ContainerEngine> {
        &self.engine
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    pub fn snapshots(&self) -> &Arc<Snapshots> {
        &self.snapshots
    }

    pub fn reaper(&self) -> &Arc<Reaper> {
        &self.reaper
    }

    pub fn image_probes(&self) -> Option<&Arc<ImageProbes>> {
        self.probes.as_ref()
    }

    /// Starts the reaper and the warm pool's refill, once.
    pub fn start(&self) {
        if self.started.swap(true, Ordering::SeqCst) {
            return;
        }
        let mut tasks = Vec::new();
        if self.reaping {
            tasks.push(crate::background::spawn(self.reaper.clone()));
        }
        // A session's own deadline is its client's request, kept with or without the sweeps.
        tasks.push(crate::background::spawn(Arc::new(reaper::DeadlineWatch(
            self.reaper.clone(),
        ))));
        if let Some(t) = self.refill.spawn() {
            tasks.push(t);
        }
        // Whether sessions from snapshots get overlays here: found now, not on a create.
        let snapshots = self.snapshots.clone();
        tasks.push(tokio::spawn(async move {
            snapshots.probe_layers_at_start().await
        }));
        // Layer workers pin their images: idle ones go whether the reaper runs or not.
        tasks.push(tokio::spawn(self.snapshots.clone().run_worker_expiry()));
        // Deep stacks are flattened off the request path.
        tasks.push(tokio::spawn(self.snapshots.clone().run_flattener()));
        if let Some(every) = self.sessions.config_metrics_interval() {
            tasks.push(self.sessions.clone().spawn_sampler(every));
        }
        self.tasks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .extend(tasks);
    }

    /// A clean stop of the refill: builds in flight finish; so do the image probes running
    /// (for a while: each removes its container).
    pub async fn shutdown(&self) {
        let probes = async {
            if let Some(p) = &self.probes {
                p.shutdown(PROBE_SHUTDOWN_WAIT).await;
            }
        };
        tokio::join!(
            self.refill.shutdown(),
            probes,
            self.snapshots.retire_idle_workers(true)
        );
        // Once no build is in flight: the shared helper, if no sandbox mounts it.
        if let Some(helper) = self.pool.factory().shared_helper() {
            helper.remove_if_unused().await;
        }
    }
}
