//! The service's life: from validated settings and a bound listener to serving until `shutdown`
//! resolves, then winding down. `main` only parses the settings, binds and calls [`serve`].

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use crate::config::{Config, Runtime};
use crate::coordination::Coordination;
use crate::engine::credentials::CredentialStore;
use crate::engine::docker::DockerEngine;
use crate::fleet::DockerConnector;
use crate::state::{AppState, app};
use crate::telemetry::runtime_probe::{self, PROBE_TIMEOUT, RuntimeHealth, Verdict};

/// A start-up failure the operator must fix before the service can run (exit code 2, as for
/// invalid settings), as opposed to the engine or the listener failing.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct SetupError(pub String);

/// How often a probe waiting for its engine (a fleet's, down at start-up) looks again.
const ENGINE_UP_POLL: Duration = Duration::from_secs(1);
/// How long shutting down waits for a probe still running.
const PROBE_SHUTDOWN_WAIT: Duration = Duration::from_secs(10);

/// Connects to the engine (or the fleet's engines) and Redis when set, starts the background
/// work (reapers, warm-pool refills, a fleet's health checks, the runtime probe) and serves the
/// API on `listener` until `shutdown` resolves; then builds in flight finish.
pub async fn serve<L>(
    config: Arc<Config>,
    listener: L,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()>
where
    L: axum::serve::Listener,
    L::Addr: std::fmt::Debug
        + Clone
        + Send
        + Sync
        + 'static
        + for<'a> axum::extract::connect_info::Connected<axum::serve::IncomingStream<'a, L>>,
{
    // Pulls authenticate as the Docker CLI of this process would (DOCKER_CONFIG, else
    // $HOME/.docker/config.json), read again at every pull.
    let credentials = CredentialStore::from_env();
    match credentials.path() {
        Some(path) => {
            tracing::info!(path = %path.display(), present = path.is_file(), "registry credentials: Docker client config")
        }
        None => {
            tracing::info!("registry credentials: none (neither DOCKER_CONFIG nor HOME is set)")
        }
    }
    // With REDIS_URL, locks and activity share one lazy connection: the service starts while
    // Redis is down and answers 503 until it is back.
    let coordination = Coordination::from_config(&config).context("DAIV_SANDBOX_REDIS_URL")?;
    // Every sandbox gets the helper; without it no session could run a command. Read once, here
    // (after the single engine answered: an unreachable engine is reported first), and shared by
    // every engine's builds.
    let helper = || {
        crate::runtime::helper_binary(config.sessions.helper_bin.as_deref())
            .map(Some)
            .map_err(SetupError)
    };
    let state = if config.fleet.engines_file.is_some() {
        // A fleet's engines are connected in the background: one that is down at start-up is
        // marked down and joins when it answers.
        tracing::info!(
            engines = config.fleet.engines.len(),
            "fleet: engines from DAIV_SANDBOX_ENGINES_FILE"
        );
        AppState::with_fleet(
            config.clone(),
            coordination.locks,
            coordination.activity,
            Arc::new(DockerConnector::new(credentials)),
            helper()?,
        )
    } else {
        let engine = DockerEngine::connect(credentials)
            .await
            .context("cannot reach the Docker engine (is dockerd running? DOCKER_HOST?)")?;
        AppState::with_coordination(
            config.clone(),
            Arc::new(engine),
            coordination.locks,
            coordination.activity,
            helper()?,
        )
    };
    // Each engine's reaper and warm-pool refill (the pools fill in the background; requests go
    // cold meanwhile) and, in a fleet, its health checks and the engines file's watch.
    let fleet = state.fleet.clone();
    fleet.start();
    let stop_probes = tokio_util::sync::CancellationToken::new();
    let probes = start_runtime_probes(&state, &stop_probes);

    match listener.local_addr() {
        Ok(addr) => {
            tracing::info!(?addr, version = crate::VERSION, "daiv-sandbox listening")
        }
        Err(e) => tracing::info!(error = %e, version = crate::VERSION, "daiv-sandbox listening"),
    }
    // One shutdown for both listeners.
    let stop = tokio_util::sync::CancellationToken::new();
    tokio::spawn({
        let stop = stop.clone();
        async move {
            shutdown.await;
            stop.cancel();
        }
    });
    let metrics = state.metrics.clone();
    let ops = state.ops();
    let os_ops = ops.clone();
    let router = app(state);
    // E2B's API, on its own port when set: a translation over the router above.
    let e2b = match config.e2b.port {
        None => None,
        Some(port) => {
            let addr = std::net::SocketAddr::new(config.server.host, port);
            // Its connections get TCP_NODELAY where their socket is taken (`reset::Socket`).
            let e2b_listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| SetupError(format!("cannot listen on {addr} (E2B_PORT): {e}")))?;
            tracing::info!(%addr, "E2B API listening");
            let service = crate::e2b::router(config.clone(), ops, &metrics);
            let stop = stop.clone();
            Some(tokio::spawn(async move {
                // The connection's socket beside each request: a stream cut short resets it.
                let service =
                    service.into_make_service_with_connect_info::<crate::e2b::reset::Socket>();
                axum::serve(e2b_listener, service)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await
            }))
        }
    };
    // OpenSandbox's API, on its own port when set: a translation over the operations too.
    let opensandbox = match config.opensandbox.port {
        None => None,
        Some(port) => {
            let addr = std::net::SocketAddr::new(config.server.host, port);
            // Events stream in small writes: no Nagle delay (40 ms against a delayed ACK).
            use axum::serve::ListenerExt;
            let os_listener = tokio::net::TcpListener::bind(addr)
                .await
                .map_err(|e| {
                    SetupError(format!("cannot listen on {addr} (OPENSANDBOX_PORT): {e}"))
                })?
                .tap_io(|tcp| {
                    if let Err(e) = tcp.set_nodelay(true) {
                        tracing::debug!(error = %e, "TCP_NODELAY not set");
                    }
                });
            tracing::info!(%addr, "OpenSandbox API listening");
            let service = crate::opensandbox::router(config.clone(), os_ops, &metrics);
            let stop = stop.clone();
            Some(tokio::spawn(async move {
                axum::serve(os_listener, service)
                    .with_graceful_shutdown(stop.cancelled_owned())
                    .await
            }))
        }
    };
    // The peer's address as a request extension: ingress tells the sandbox's server who asked
    // (`X-Forwarded-For`).
    let served = axum::serve(
        listener,
        router.into_make_service_with_connect_info::<L::Addr>(),
    )
    .with_graceful_shutdown(stop.clone().cancelled_owned())
    .await
    .context("server error");
    stop.cancel();
    if let Some(task) = e2b
        && let Ok(Err(e)) = task.await
    {
        tracing::error!(error = %e, "E2B API listener failed");
    }
    if let Some(task) = opensandbox
        && let Ok(Err(e)) = task.await
    {
        tracing::error!(error = %e, "OpenSandbox API listener failed");
    }
    // A probe still running gets a moment to finish and remove its container; past it, the
    // container (role `runtime-probe`) sleeps out its own time-out.
    stop_probes.cancel();
    let _ = tokio::time::timeout(PROBE_SHUTDOWN_WAIT, futures::future::join_all(probes)).await;
    // Builds in flight finish; the members stay unless WARM_POOL_REMOVE_ON_SHUTDOWN.
    fleet.shutdown().await;
    served
}

/// Under `runsc`, one start-up probe per engine (a fleet's as each comes up) in
/// `RUNTIME_PROBE_IMAGE` or the first warm-pool image: see [`runtime_probe`]. Nothing under
/// `runc`; the images sessions use are probed as they are used.
/// A probe still waiting for its engine when `stop` is cancelled gives up.
fn start_runtime_probes(
    state: &AppState,
    stop: &tokio_util::sync::CancellationToken,
) -> Vec<tokio::task::JoinHandle<()>> {
    let config = state.config.clone();
    if config.sessions.runtime != Runtime::Runsc {
        return Vec::new();
    }
    let runtime = config.sessions.runtime.as_str();
    let health: Arc<RuntimeHealth> = state.runtime.clone();
    let Some(image) = runtime_probe::probe_image(&config) else {
        // Each image sessions use is probed on its first use; until the first, nothing is known.
        for cell in state.fleet.cells() {
            health.record(
                runtime,
                &cell.name(),
                None,
                Verdict::Unknown {
                    reason: "no image probed yet: each image is probed when a session first \
                             uses it (DAIV_SANDBOX_RUNTIME_PROBE_IMAGE probes one at start-up)"
                        .to_string(),
                },
            );
        }
        return Vec::new();
    };
    state
        .fleet
        .cells()
        .into_iter()
        .map(|cell| {
            let engine_name = cell.name();
            health.expect(runtime, &engine_name, Some(&image));
            crate::background::spawn(Arc::new(RuntimeProbe {
                cell,
                config: config.clone(),
                health: health.clone(),
                image: image.clone(),
                stop: stop.clone(),
            }))
        })
        .collect()
}

/// One engine's start-up probe of the sandboxes' runtime: once its engine is up (a fleet's may
/// come up later), one probe, its verdict recorded; given up when the service stops first.
struct RuntimeProbe {
    cell: Arc<crate::fleet::Cell>,
    config: Arc<Config>,
    health: Arc<RuntimeHealth>,
    image: String,
    stop: tokio_util::sync::CancellationToken,
}

impl crate::background::Background for RuntimeProbe {
    fn name(&self) -> &'static str {
        "runtime probe"
    }

    async fn round(self: Arc<Self>) -> std::ops::ControlFlow<()> {
        use std::ops::ControlFlow;
        if self.stop.is_cancelled() {
            return ControlFlow::Break(());
        }
        if !self.cell.is_up() {
            return ControlFlow::Continue(());
        }
        // Through the engine's image probes, so that a session of the image finds the verdict.
        let verdict = match self.cell.image_probes() {
            Some(probes) => probes.probe_reference(&self.image).await,
            None => {
                runtime_probe::probe(
                    &**self.cell.engine(),
                    &self.config,
                    &self.image,
                    PROBE_TIMEOUT,
                )
                .await
            }
        };
        let runtime = self.config.sessions.runtime.as_str();
        self.health
            .record(runtime, &self.cell.name(), Some(&self.image), verdict);
        ControlFlow::Break(())
    }

    async fn pause(&self) {
        tokio::select! {
            () = self.stop.cancelled() => {}
            () = tokio::time::sleep(ENGINE_UP_POLL) => {}
        }
    }
}
