//! What the service tells its operators: logs, metrics and error reports.
//!
//! # Layout
//! - [`metrics`]: the Prometheus registry on `prometheus-client`, in the text format.
//! - [`probe`]: the `healthcheck` subcommand the container image runs.
//! - [`runtime_probe`]: the start-up probe of the sandboxes' runtime (`runsc`).
//! - [`reporting`]: Sentry options and which log events become Sentry events.

pub mod metrics;
pub mod probe;
pub mod reporting;
pub mod runtime_probe;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::Layer as _;
use tracing_subscriber::layer::SubscriberExt as _;
use tracing_subscriber::util::SubscriberInitExt as _;

use crate::config::{Config, Environment};

/// Installs the log subscriber and, when configured, the Sentry client. Keep the returned guard
/// alive for the life of the process: dropping it flushes queued reports.
///
/// Logs are JSON lines (one object per event, fields flattened) in `production` and readable
/// text in `local`. `RUST_LOG` overrides `LOG_LEVEL` for debugging a single module.
pub fn init(config: &Config) -> Option<sentry::ClientInitGuard> {
    let guard = reporting::client_options(config).map(sentry::init);
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        // The Docker client and the MCP SDK log request payloads (commands, environment, file
        // contents, a session_create's egress secrets) at debug: never, whatever LOG_LEVEL says.
        EnvFilter::new(format!(
            "{},bollard=warn,hyper=warn,hyper_util=warn,h2=warn,ureq=warn,rustls=warn,rmcp=warn",
            config.telemetry.log_level.directive()
        ))
    });
    let fmt = if config.telemetry.environment == Environment::Production {
        tracing_subscriber::fmt::layer()
            .json()
            .flatten_event(true)
            .boxed()
    } else {
        tracing_subscriber::fmt::layer().boxed()
    };
    let reported = guard.as_ref().map(|_| reporting::error_layer());
    let traced = guard
        .as_ref()
        .filter(|_| config.telemetry.sentry.traces_sample_rate > 0.0)
        .map(|_| {
            sentry::integrations::tracing::SpanLayer::new()
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
        });
    // SENTRY_ENABLE_LOGS: info and above also go to Sentry's log stream (the same lines as
    // stdout, so the same rule holds: no keys, secrets or file contents in any field).
    let forwarded = guard
        .as_ref()
        .filter(|_| config.telemetry.sentry.enable_logs)
        .map(|_| {
            sentry::integrations::tracing::LogLayer::new()
                .with_filter(tracing_subscriber::filter::LevelFilter::INFO)
        });
    tracing_subscriber::registry()
        .with(fmt.with_filter(filter))
        .with(reported)
        .with(traced)
        .with(forwarded)
        .init();
    if guard.is_some() {
        tracing::info!("error reports go to Sentry");
    }
    guard
}
