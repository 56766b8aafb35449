//! `daiv-sandbox`: reads the `DAIV_SANDBOX_*` settings, connects to Docker (and Redis, when set),
//! starts the reaper and serves the API.

use std::sync::Arc;

use anyhow::Context;
use axum::serve::ListenerExt;
use control_plane::config::{self, ProcessEnv};
use control_plane::coordination::Coordination;
use control_plane::engine::credentials::CredentialStore;
use control_plane::engine::docker::DockerEngine;
use control_plane::{AppState, app};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("healthcheck") {
        std::process::exit(control_plane::telemetry::probe::healthcheck());
    }
    let config = match config::load(&ProcessEnv::new()) {
        Ok(c) => Arc::new(c),
        Err(e) => {
            eprintln!("daiv-sandbox: {e}");
            std::process::exit(2);
        }
    };
    // Mutual TLS to a fleet's engines goes through rustls, over ring as everywhere else.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Held until main returns: dropping it flushes queued error reports.
    let _reports = control_plane::telemetry::init(&config);

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
            credentials,
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
        )
    };
    // Every sandbox gets the helper; without it no session could run a command. The state read
    // it once; only a failure reads again, to say why.
    if !state.sessions.has_helper() {
        let why = control_plane::runtime::helper_binary(config.sessions.helper_bin.as_deref())
            .err()
            .unwrap_or_else(|| "the session helper could not be read".to_string());
        eprintln!("daiv-sandbox: {why}");
        std::process::exit(2);
    }
    // Each engine's reaper and warm-pool refill (the pools fill in the background; requests go
    // cold meanwhile) and, in a fleet, its health checks and the engines file's watch.
    let fleet = state.fleet.clone();
    fleet.start();

    let addr = std::net::SocketAddr::new(config.server.host, config.server.port);
    // Small request/response exchanges: no Nagle delay on any accepted socket.
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .with_context(|| format!("cannot listen on {addr}"))?
        .tap_io(|tcp| {
            if let Err(e) = tcp.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
        });
    tracing::info!(%addr, version = control_plane::VERSION, "daiv-sandbox listening");
    let served = axum::serve(listener, app(state))
        .with_graceful_shutdown(shutdown_signal())
        .await
        .context("server error");
    // Builds in flight finish; the members stay unless WARM_POOL_REMOVE_ON_SHUTDOWN.
    fleet.shutdown().await;
    served
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}
