//! Logs and error reports: the environment (log format, Sentry's environment), the log level in
//! the reference's Python spelling, and Sentry.

use super::PREFIX;
use super::parse::Parser;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Environment {
    Local,
    Production,
}

/// Log levels in the reference's Python spelling, mapped to `tracing` levels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogLevel {
    Debug,
    Info,
    Warning,
    Error,
    Critical,
}

impl LogLevel {
    /// The `tracing` filter directive: Python's WARNING is `warn`, CRITICAL has no equivalent and
    /// maps to `error`.
    pub fn directive(self) -> &'static str {
        match self {
            LogLevel::Debug => "debug",
            LogLevel::Info => "info",
            LogLevel::Warning => "warn",
            LogLevel::Error | LogLevel::Critical => "error",
        }
    }
}

#[derive(Debug, Clone)]
pub struct SentryConfig {
    pub dsn: Option<String>,
    pub enable_logs: bool,
    pub traces_sample_rate: f64,
    pub profiles_sample_rate: f64,
    pub send_default_pii: bool,
}

#[derive(Debug, Clone)]
pub struct TelemetryConfig {
    pub environment: Environment,
    pub log_level: LogLevel,
    pub sentry: SentryConfig,
}

impl TelemetryConfig {
    pub(super) fn load(p: &mut Parser<'_>) -> Self {
        let environment = p.choice(
            "ENVIRONMENT",
            Environment::Production,
            &[
                ("local", Environment::Local),
                ("production", Environment::Production),
            ],
        );

        let sentry = SentryConfig {
            dsn: p.get("SENTRY_DSN"),
            enable_logs: p.bool_or("SENTRY_ENABLE_LOGS", false),
            traces_sample_rate: p.rate_or("SENTRY_TRACES_SAMPLE_RATE", 0.0),
            profiles_sample_rate: p.rate_or("SENTRY_PROFILES_SAMPLE_RATE", 0.0),
            send_default_pii: p.bool_or("SENTRY_SEND_DEFAULT_PII", false),
        };
        if let Some(dsn) = &sentry.dsn
            && !(dsn.starts_with("http://") || dsn.starts_with("https://"))
        {
            p.errors.push(format!(
                "{PREFIX}SENTRY_DSN: expected an http(s) URL (value not shown)"
            ));
        }

        let log_level = p.choice(
            "LOG_LEVEL",
            LogLevel::Info,
            &[
                ("DEBUG", LogLevel::Debug),
                ("INFO", LogLevel::Info),
                ("WARNING", LogLevel::Warning),
                ("ERROR", LogLevel::Error),
                ("CRITICAL", LogLevel::Critical),
            ],
        );

        Self {
            environment,
            log_level,
            sentry,
        }
    }
}
