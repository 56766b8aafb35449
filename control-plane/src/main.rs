//! `daiv-sandbox`: reads the `DAIV_SANDBOX_*` settings, binds the listener and hands both to
//! [`control_plane::serve::serve`] until SIGINT or SIGTERM.

use std::sync::Arc;

use anyhow::Context;
use axum::serve::ListenerExt;
use control_plane::config::{self, ProcessEnv};
use control_plane::serve::{SetupError, serve};

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    if std::env::args().nth(1).as_deref() == Some("healthcheck") {
        std::process::exit(control_plane::telemetry::probe::healthcheck());
    }
    // `daiv-sandbox mcp --url … --key-file …`: MCP on stdio, bridged to a running service.
    if std::env::args().nth(1).as_deref() == Some("mcp") {
        std::process::exit(control_plane::mcp::stdio::main(std::env::args().skip(2)).await);
    }
    let config = match config::load(&ProcessEnv::new()) {
        Ok(c) => Arc::new(c),
        Err(e) => fail(e),
    };
    // Mutual TLS to a fleet's engines goes through rustls, over ring as everywhere else.
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Held until main returns: dropping it flushes queued error reports.
    let _reports = control_plane::telemetry::init(&config);

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
    match serve(config, listener, shutdown_signal()).await {
        Err(e) if e.is::<SetupError>() => fail(e),
        served => served,
    }
}

/// What the operator must fix first (settings, the helper binary): said on stderr, exit 2.
fn fail(e: impl std::fmt::Display) -> ! {
    eprintln!("daiv-sandbox: {e}");
    std::process::exit(2);
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
