//! `daiv-egress-gateway`: runs the proxy, or an operator subcommand (`policy check`,
//! `policy explain`, `gen-ca`). Logs are JSON on stderr (`RUST_LOG`, else `LOG_LEVEL`, else
//! info); audit lines are JSON on stdout.

use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use egress_gateway::config::{Cli, Command, PolicyCommand};
use egress_gateway::{Gateway, audit::StdoutSink, cli};
use shared_policy::sidecar;
use tracing::Instrument;
use tracing_subscriber::EnvFilter;

fn main() -> anyhow::Result<()> {
    let args = Cli::parse();
    let mut stdout = std::io::stdout();
    let code = match args.command {
        Some(Command::Policy {
            command: PolicyCommand::Check { file, api },
        }) => cli::policy_check(&file, api, &mut stdout)?,
        Some(Command::Policy {
            command:
                PolicyCommand::Explain {
                    file,
                    host,
                    method,
                    path,
                    shadow,
                },
        }) => cli::policy_explain(
            &file,
            &cli::Query {
                host: &host,
                method: &method,
                path: path.as_deref(),
                shadow,
            },
            &mut stdout,
        )?,
        Some(Command::Health {
            health_listen,
            expect_version,
            timeout_ms,
        }) => cli::health(
            health_listen,
            expect_version.as_deref(),
            std::time::Duration::from_millis(timeout_ms),
            &mut stdout,
        )?,
        Some(Command::GenCa {
            cert_out,
            key_out,
            common_name,
            force,
        }) => cli::gen_ca(&cert_out, &key_out, &common_name, force, &mut stdout)?,
        None => {
            init_logging();
            run(args.serve)?;
            0
        }
    };
    std::process::exit(code);
}

fn init_logging() {
    let level = std::env::var("LOG_LEVEL")
        .ok()
        .map(|l| match l.to_ascii_lowercase().as_str() {
            "warning" => "warn".to_owned(),
            "critical" => "error".to_owned(),
            other => other.to_owned(),
        });
    let filter = EnvFilter::try_from_default_env()
        .or_else(|_| EnvFilter::try_new(level.as_deref().unwrap_or("info")))
        .unwrap_or_else(|_| EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .json()
        .with_writer(std::io::stderr)
        .with_env_filter(filter)
        .init();
}

#[tokio::main]
async fn run(args: egress_gateway::config::ServeArgs) -> anyhow::Result<()> {
    let config = args.load(Arc::new(StdoutSink)).context("configuration")?;
    // Every line the gateway logs carries its session; `instrument` keeps the span on this task
    // across its awaits (a guard from `span.enter()` would leak it onto whatever else the worker
    // thread polls).
    let span = tracing::info_span!("gateway", session_id = %config.session_id);
    serve(args, config).instrument(span).await
}

async fn serve(
    args: egress_gateway::config::ServeArgs,
    config: egress_gateway::GatewayConfig,
) -> anyhow::Result<()> {
    let gateway = Gateway::new(config).context("configuration")?;
    let listener = tokio::net::TcpListener::bind(args.listen)
        .await
        .with_context(|| format!("listen on {}", args.listen))?;
    let health = tokio::net::TcpListener::bind(args.health_listen)
        .await
        .with_context(|| format!("health listen on {}", args.health_listen))?;
    let (stop_metrics, metrics_stopped) = tokio::sync::oneshot::channel::<()>();
    if let Some(addr) = args.metrics_listen {
        let metrics = tokio::net::TcpListener::bind(addr)
            .await
            .with_context(|| format!("metrics listen on {addr}"))?;
        tracing::info!(listen = %addr, "metrics endpoint listening");
        tokio::spawn(egress_gateway::metrics::serve(
            metrics,
            gateway.scrape(),
            async move {
                let _ = metrics_stopped.await;
            },
        ));
    }
    // The control plane waits for this line before it lets the sandbox use the gateway.
    tracing::info!(listen = %args.listen, health_listen = %args.health_listen, policy = %args.policy_file.display(), "{}", sidecar::READY_LINE);
    gateway.serve(listener, health, shutdown_signal()).await?;
    let _ = stop_metrics.send(());
    Ok(())
}

/// SIGTERM (docker stop) or SIGINT.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
