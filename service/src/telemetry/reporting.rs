//! Error reports to Sentry: which settings turn them on, and what may leave the process.
//!
//! Reported: every 5xx (logged once, in [`crate::error::ApiError`]'s response mapping), panics
//! (the SDK's panic hook; request handlers also answer 500 through
//! `routes::observe::panic_response`) and reaper failures (its warnings). The events carry the
//! log message, its structured fields and the request's route, method and session id as tags;
//! never a request body or header: the service does not attach them, and without
//! `SENTRY_SEND_DEFAULT_PII` any request or user data the SDK might add is stripped before
//! sending.

use sentry::integrations::tracing::ErrorLayer;
use tracing::{Level, Metadata};

use crate::config::{Config, Environment};

/// Target of the log line written when a handler panics. The panic itself is reported to Sentry
/// by the panic hook; the error layer skips this target so one panic is one event.
pub const PANIC_TARGET: &str = "daiv_sandbox::panic";

/// The Sentry client options, or `None` when nothing may be sent: no DSN, or the `local`
/// environment (a developer's machine never reports to the team's project).
pub fn client_options(config: &Config) -> Option<sentry::ClientOptions> {
    if config.telemetry.environment == Environment::Local {
        return None;
    }
    let dsn = config.telemetry.sentry.dsn.as_deref()?;
    let dsn = match dsn.parse::<sentry::types::Dsn>() {
        Ok(d) => d,
        Err(e) => {
            // Config validation checked the scheme; the SDK is stricter (it needs a key and a
            // project id). Start without reporting rather than refuse to serve.
            eprintln!("daiv-sandbox: DAIV_SANDBOX_SENTRY_DSN unusable ({e}); Sentry disabled");
            return None;
        }
    };
    let pii = config.telemetry.sentry.send_default_pii;
    let mut options = sentry::ClientOptions::new()
        .traces_sample_rate(config.telemetry.sentry.traces_sample_rate as f32)
        .send_default_pii(pii)
        .attach_stacktrace(false);
    options.dsn = Some(dsn);
    options.release = Some(crate::VERSION.into());
    options.environment = Some("production".into());
    if !pii {
        options = options.before_send(|mut event| {
            event.request = None;
            event.user = None;
            Some(event)
        });
    }
    Some(options)
}

/// Which log events become Sentry events: errors (except the panic line, reported by the hook)
/// and the reaper's warnings, each of which is a failed sweep or removal.
pub fn is_reported(meta: &Metadata<'_>) -> bool {
    if !meta.is_event() {
        return false;
    }
    match *meta.level() {
        Level::ERROR => meta.target() != PANIC_TARGET,
        Level::WARN => meta.target().starts_with("control_plane::reaper"),
        _ => false,
    }
}

/// The tracing layer that turns [`is_reported`] events into Sentry events.
pub fn error_layer<S>() -> impl tracing_subscriber::Layer<S>
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    use tracing_subscriber::Layer as _;
    ErrorLayer::new().with_filter(tracing_subscriber::filter::filter_fn(is_reported))
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;

    fn config(pairs: &[(&str, &str)]) -> Config {
        let mut env: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        env.insert("API_KEY".into(), "k".into());
        crate::config::load(&env).expect("valid config")
    }

    #[test]
    fn local_never_reports() {
        let c = config(&[
            ("ENVIRONMENT", "local"),
            ("SENTRY_DSN", "http://key@127.0.0.1:9/1"),
        ]);
        assert!(client_options(&c).is_none());
    }

    #[test]
    fn production_reports_with_release_and_environment() {
        let c = config(&[("SENTRY_DSN", "http://key@127.0.0.1:9/1")]);
        let o = client_options(&c).expect("enabled");
        assert_eq!(o.release.as_deref(), Some(crate::VERSION));
        assert_eq!(o.environment.as_deref(), Some("production"));
        assert!(!o.send_default_pii);
        assert!(
            o.before_send.is_some(),
            "request and user data are stripped"
        );
    }

    #[test]
    fn no_dsn_no_client() {
        assert!(client_options(&config(&[])).is_none());
    }
}
