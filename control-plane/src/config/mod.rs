//! `DAIV_SANDBOX_*` settings: names, defaults and meanings follow the reference README's table.
//!
//! Every variable is parsed and validated at start-up; all problems are collected and reported at
//! once, each naming its variable, so an operator fixes a deployment in one round trip.
//! A value may also come from a file under `/run/secrets/` named after the variable (as Docker and
//! Kubernetes secrets are mounted); the environment wins over the file, and an empty value counts
//! as unset.

use std::fmt;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

mod parse;
#[cfg(test)]
mod tests;

pub use parse::{ProcessEnv, Source};

use parse::Parser;

pub const PREFIX: &str = "DAIV_SANDBOX_";

/// Directory basenames pruned from `fs/glob` and `fs/grep` unless `FS_PRUNE_DIRS` replaces the
/// list: caches, VCS metadata and build output. Dependency sources (`node_modules`, `.venv`,
/// `vendor`) stay searchable on purpose: agents read dependency code.
pub const DEFAULT_PRUNE_DIRS: &[&str] = &[
    ".git",
    ".hg",
    ".svn",
    "__pycache__",
    ".mypy_cache",
    ".pytest_cache",
    ".ruff_cache",
    ".tox",
    ".nox",
    ".cache",
    ".gradle",
    ".next",
    ".nuxt",
    ".parcel-cache",
    ".turbo",
    ".terraform",
    "target",
    "obj",
    "build",
    "dist",
    "coverage",
    "htmlcov",
    "*.egg-info",
];

/// A value that must never be printed: API keys. `Debug` shows `***`.
#[derive(Clone)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("***")
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Environment {
    Local,
    Production,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Runtime {
    Runc,
    Runsc,
}

impl Runtime {
    pub fn as_str(self) -> &'static str {
        match self {
            Runtime::Runc => "runc",
            Runtime::Runsc => "runsc",
        }
    }
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
pub struct EgressCa {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
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
pub struct Config {
    pub api_key: Secret,
    pub api_v1_str: String,
    pub environment: Environment,
    pub sentry: SentryConfig,
    pub runtime: Runtime,
    pub run_uid: u32,
    pub run_gid: u32,
    pub network: Option<String>,
    pub egress_proxy_image: String,
    pub egress_proxy_port: u16,
    pub egress_proxy_runtime: Runtime,
    pub egress_proxy_network: Option<String>,
    pub egress_proxy_memory_bytes: Option<i64>,
    pub egress_proxy_cpus: Option<f64>,
    pub egress_ca: Option<EgressCa>,
    /// Non-global networks gateways may still reach (their SSRF guard refuses the rest).
    pub egress_allowed_cidrs: Vec<ipnet::IpNet>,
    /// Extra CA bundle gateways trust for upstream servers (private or test PKI).
    pub egress_upstream_ca_file: Option<PathBuf>,
    /// HTTP proxy gateways send their own egress through (`http://[user:pass@]host[:port]`);
    /// a secret, since it may carry credentials.
    pub egress_upstream_proxy: Option<Secret>,
    /// Address pool the per-session internal networks are carved from (one /29 each).
    pub egress_subnet_pool: ipnet::Ipv4Net,
    pub fs_prune_dirs: Vec<String>,
    /// `None` means no default timeout (`COMMAND_TIMEOUT=0`).
    pub command_timeout: Option<Duration>,
    pub redis_url: Option<Secret>,
    pub session_lock_ttl: Duration,
    pub session_lock_wait: Duration,
    pub session_lock_refresh: Duration,
    pub reaper_enabled: bool,
    pub reaper_interval: Duration,
    pub session_grace: Duration,
    pub max_stopped_sessions: u32,
    /// `None` disables idle reaping of running sessions.
    pub running_session_max_idle: Option<Duration>,
    pub stop_timeout: Duration,
    pub host: IpAddr,
    pub port: u16,
    pub log_level: LogLevel,
    /// Name of this deployment, carried by everything it creates: replicas of one deployment
    /// share it, and the reaper never touches another deployment's sessions on a shared engine.
    pub deployment: String,
    /// The static `daiv-sandbox-helper` binary given to every sandbox (`HELPER_BIN`); unset =
    /// found beside the service's executable (see `runtime::helper_binary`).
    pub helper_bin: Option<std::path::PathBuf>,
    // Beyond the reference: limits that keep the service's memory independent of what sandboxes do.
    /// Bytes of output kept per command; the rest is counted and replaced by a marker.
    pub output_max_bytes: usize,
    /// Process limit per sandbox container (fork bombs stay inside their session).
    pub pids_limit: i64,
    /// Upper bound on the decompressed bytes of one seed archive.
    pub seed_max_bytes: u64,
    /// Upper bound on the number of members of one seed archive.
    pub seed_max_members: u64,
    /// `GET /metrics` without the API key (for scrapers that cannot send a header).
    pub metrics_public: bool,
    /// Output bytes kept per background process (oldest dropped past it).
    pub process_output_bytes: u64,
    /// Live background processes allowed per session.
    pub max_processes: u32,
    /// Longest a process poll may wait for new output (`wait` is capped to it).
    pub process_wait_max: Duration,
    /// Most silence on a streaming run before a heartbeat line.
    pub stream_heartbeat: Duration,
    /// Warm pool of isolated sessions: (image, members) (`WARM_POOL`); empty = none.
    pub warm_pool: Vec<(String, u32)>,
    /// Warm pool of egress sessions (whole triads), likewise (`WARM_POOL_EGRESS`).
    pub warm_pool_egress: Vec<(String, u32)>,
    /// Remove this deployment's unclaimed pool members on a clean shutdown (default: kept for
    /// the next start).
    pub warm_pool_remove_on_shutdown: bool,
}

/// Every invalid variable, one per line.
#[derive(Debug, thiserror::Error)]
#[error("invalid configuration:\n{}", .0.join("\n"))]
pub struct ConfigError(pub Vec<String>);

/// Parses and validates every setting; `Err` lists each bad variable.
pub fn load(src: &dyn Source) -> Result<Config, ConfigError> {
    let mut p = Parser::new(src);
    let runtimes = [("runc", Runtime::Runc), ("runsc", Runtime::Runsc)];

    let api_key = src.get("API_KEY").map(Secret::new);
    if api_key.is_none() {
        p.errors.push(format!(
            "{PREFIX}API_KEY: required (the key clients send in X-API-Key)"
        ));
    }

    let api_v1_str = p.string_or("API_V1_STR", "/api/v1");
    let api_v1_str = api_v1_str.trim_end_matches('/').to_string();
    if !api_v1_str.is_empty()
        && (!api_v1_str.starts_with('/')
            || !api_v1_str
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || "/-_.~".contains(c)))
    {
        let raw = api_v1_str.clone();
        p.fail("API_V1_STR", &raw, "expected a path such as /api/v1");
    }

    let environment = p.choice(
        "ENVIRONMENT",
        Environment::Production,
        &[
            ("local", Environment::Local),
            ("production", Environment::Production),
        ],
    );

    let sentry = SentryConfig {
        dsn: src.get("SENTRY_DSN"),
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

    let runtime = p.choice("RUNTIME", Runtime::Runc, &runtimes);
    let run_uid = p.parse_or::<u32>("RUN_UID", 1000);
    let run_gid = p.parse_or::<u32>("RUN_GID", 1000);

    let network = src.get("NETWORK");
    let egress_proxy_image = p.string_or("EGRESS_PROXY_IMAGE", "daiv-sandbox-egress:local");
    let egress_proxy_port = p.parse_or::<u16>("EGRESS_PROXY_PORT", 8080);
    if egress_proxy_port == 0 {
        p.fail(
            "EGRESS_PROXY_PORT",
            "0",
            "expected a port between 1 and 65535",
        );
    }
    let egress_proxy_runtime = p.choice("EGRESS_PROXY_RUNTIME", Runtime::Runc, &runtimes);
    let egress_proxy_network = src.get("EGRESS_PROXY_NETWORK");
    // A default limit: a sandbox drives its gateway's memory (connections, buffers), so the
    // host must not be the limit. 0 lifts it.
    let egress_proxy_memory_bytes =
        Some(p.parse_or::<i64>("EGRESS_PROXY_MEMORY_BYTES", 128 * 1024 * 1024)).filter(|m| *m != 0);
    if let Some(m) = egress_proxy_memory_bytes
        && m < 6 * 1024 * 1024
    {
        p.fail(
            "EGRESS_PROXY_MEMORY_BYTES",
            &m.to_string(),
            "Docker needs at least 6 MiB (6291456)",
        );
    }
    let egress_proxy_cpus = p.positive_f64_opt("EGRESS_PROXY_CPUS");

    let egress_ca = match (
        src.get("EGRESS_CA_CERT_FILE"),
        src.get("EGRESS_CA_KEY_FILE"),
    ) {
        (None, None) => None,
        (Some(cert), Some(key)) => {
            for (name, path) in [("EGRESS_CA_CERT_FILE", &cert), ("EGRESS_CA_KEY_FILE", &key)] {
                if !Path::new(path).is_file() {
                    p.fail(name, path, "file not found or not a regular file");
                }
            }
            Some(EgressCa {
                cert_file: cert.into(),
                key_file: key.into(),
            })
        }
        _ => {
            p.errors.push(format!(
                "{PREFIX}EGRESS_CA_CERT_FILE and {PREFIX}EGRESS_CA_KEY_FILE must be set together (or neither)"
            ));
            None
        }
    };

    let mut egress_allowed_cidrs = Vec::new();
    if let Some(raw) = src.get("EGRESS_ALLOWED_CIDRS") {
        for item in raw.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            match item.parse::<ipnet::IpNet>() {
                Ok(net) => egress_allowed_cidrs.push(net),
                Err(e) => p.fail("EGRESS_ALLOWED_CIDRS", item, e),
            }
        }
    }
    let egress_upstream_ca_file = src.get("EGRESS_UPSTREAM_CA_FILE").map(PathBuf::from);
    if let Some(path) = &egress_upstream_ca_file
        && !path.is_file()
    {
        let raw = path.display().to_string();
        p.fail(
            "EGRESS_UPSTREAM_CA_FILE",
            &raw,
            "file not found or not a regular file",
        );
    }
    let egress_upstream_proxy = src.get("EGRESS_UPSTREAM_PROXY");
    if let Some(raw) = &egress_upstream_proxy {
        let uri = raw.parse::<axum::http::Uri>();
        let ok = uri.as_ref().is_ok_and(|u| {
            u.scheme_str() == Some("http") && u.host().is_some_and(|h| !h.is_empty())
        });
        if !ok {
            // Never the value: it may carry a password.
            p.fail(
                "EGRESS_UPSTREAM_PROXY",
                "(hidden)",
                "expected http://[user:pass@]host[:port]",
            );
        }
    }
    let egress_upstream_proxy = egress_upstream_proxy.map(Secret::new);
    let default_pool: ipnet::Ipv4Net =
        ipnet::Ipv4Net::new(std::net::Ipv4Addr::new(100, 64, 0, 0), 10).unwrap_or_default();
    let egress_subnet_pool = p.parse_or::<ipnet::Ipv4Net>("EGRESS_SUBNET_POOL", default_pool);
    if egress_subnet_pool.prefix_len() > 24 {
        let raw = egress_subnet_pool.to_string();
        p.fail(
            "EGRESS_SUBNET_POOL",
            &raw,
            "needs room for many /29 networks (at most /24)",
        );
    }

    let fs_prune_dirs: Vec<String> = match src.get("FS_PRUNE_DIRS") {
        Some(raw) => raw
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(String::from)
            .collect(),
        None => DEFAULT_PRUNE_DIRS.iter().map(|s| s.to_string()).collect(),
    };
    for dir in &fs_prune_dirs {
        if dir.contains('/') || dir.contains('\0') || dir.contains('\n') {
            let raw = dir.clone();
            p.fail(
                "FS_PRUNE_DIRS",
                &raw,
                "entries are directory basenames or globs, without '/'",
            );
        }
    }

    let command_timeout = Some(p.seconds_or("COMMAND_TIMEOUT", 0)).filter(|d| !d.is_zero());

    let redis_url = src.get("REDIS_URL").map(Secret::new);
    if let Some(url) = &redis_url
        && !(url.expose().starts_with("redis://")
            || url.expose().starts_with("rediss://")
            || url.expose().starts_with("unix://"))
    {
        p.errors.push(format!(
            "{PREFIX}REDIS_URL: expected a redis://, rediss:// or unix:// URL (value not shown)"
        ));
    }
    let session_lock_ttl = p.seconds_or("SESSION_LOCK_TTL_SECONDS", 900);
    if session_lock_ttl.is_zero() {
        p.fail("SESSION_LOCK_TTL_SECONDS", "0", "must be at least 1");
    }
    let session_lock_wait = p.float_seconds_or("SESSION_LOCK_WAIT_SECONDS", 30.0);
    let session_lock_refresh = p.float_seconds_or("SESSION_LOCK_REFRESH_SECONDS", 30.0);

    let reaper_enabled = p.bool_or("REAPER_ENABLED", true);
    let reaper_interval = p.seconds_or("REAPER_INTERVAL_SECONDS", 600);
    if reaper_interval.is_zero() {
        p.fail("REAPER_INTERVAL_SECONDS", "0", "must be at least 1");
    }
    let session_grace = p.seconds_or("SESSION_GRACE_SECONDS", 43_200);
    let max_stopped_sessions = p.parse_or::<u32>("MAX_STOPPED_SESSIONS", 50);
    let running_session_max_idle =
        Some(p.seconds_or("RUNNING_SESSION_MAX_IDLE_SECONDS", 14_400)).filter(|d| !d.is_zero());
    let stop_timeout = p.seconds_or("STOP_TIMEOUT_SECONDS", 2);

    let host = p.parse_or::<IpAddr>("HOST", IpAddr::from([0, 0, 0, 0]));
    let port = p.parse_or::<u16>("PORT", 8000);
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

    let helper_bin = src.get("HELPER_BIN").map(std::path::PathBuf::from);
    let deployment = p.string_or("DEPLOYMENT", "default");
    if deployment.is_empty()
        || deployment.len() > 63
        || !deployment
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
    {
        let raw = deployment.clone();
        p.fail(
            "DEPLOYMENT",
            &raw,
            "expected up to 63 letters, digits, '-', '_' or '.'",
        );
    }

    let output_max_bytes = p.parse_or::<usize>("OUTPUT_MAX_BYTES", 16 * 1024 * 1024);
    if output_max_bytes == 0 {
        p.fail("OUTPUT_MAX_BYTES", "0", "must be at least 1");
    }
    let pids_limit = p.parse_or::<i64>("PIDS_LIMIT", 4096);
    if pids_limit < 1 {
        let raw = pids_limit.to_string();
        p.fail("PIDS_LIMIT", &raw, "must be at least 1");
    }
    let seed_max_bytes = p.parse_or::<u64>("SEED_MAX_BYTES", 2 * 1024 * 1024 * 1024);
    let seed_max_members = p.parse_or::<u64>("SEED_MAX_MEMBERS", 200_000);
    let metrics_public = p.bool_or("METRICS_PUBLIC", false);
    let process_output_bytes = p.parse_or::<u64>("PROCESS_OUTPUT_BYTES", 1024 * 1024);
    if !(1..=8 * 1024 * 1024).contains(&process_output_bytes) {
        let raw = process_output_bytes.to_string();
        p.fail(
            "PROCESS_OUTPUT_BYTES",
            &raw,
            "must be between 1 and 8388608 (8 MiB)",
        );
    }
    let max_processes = p.parse_or::<u32>("MAX_PROCESSES", 16);
    if max_processes == 0 {
        p.fail("MAX_PROCESSES", "0", "must be at least 1");
    }
    let process_wait_max = p.parse_or::<u64>("PROCESS_WAIT_MAX_SECONDS", 30);
    if process_wait_max > 300 {
        let raw = process_wait_max.to_string();
        p.fail("PROCESS_WAIT_MAX_SECONDS", &raw, "must be at most 300");
    }
    let stream_heartbeat = p.parse_or::<u64>("STREAM_HEARTBEAT_SECONDS", 10);
    if !(1..=10).contains(&stream_heartbeat) {
        let raw = stream_heartbeat.to_string();
        p.fail("STREAM_HEARTBEAT_SECONDS", &raw, "must be between 1 and 10");
    }

    let pool_setting = |p: &mut Parser<'_>, key: &str| match src.get(key) {
        None => Vec::new(),
        Some(raw) => crate::pool::parse_targets(&raw).unwrap_or_else(|why| {
            p.fail(key, &raw, why);
            Vec::new()
        }),
    };
    let warm_pool = pool_setting(&mut p, "WARM_POOL");
    let warm_pool_egress = pool_setting(&mut p, "WARM_POOL_EGRESS");
    if !warm_pool_egress.is_empty() && egress_ca.is_none() {
        p.errors.push(format!(
            "{PREFIX}WARM_POOL_EGRESS: egress sessions need {PREFIX}EGRESS_CA_CERT_FILE and {PREFIX}EGRESS_CA_KEY_FILE"
        ));
    }
    let warm_pool_remove_on_shutdown = p.bool_or("WARM_POOL_REMOVE_ON_SHUTDOWN", false);

    p.finish()?;
    Ok(Config {
        api_key: api_key.unwrap_or_else(|| Secret::new("")),
        api_v1_str,
        environment,
        sentry,
        runtime,
        run_uid,
        run_gid,
        network,
        egress_proxy_image,
        egress_proxy_port,
        egress_proxy_runtime,
        egress_proxy_network,
        egress_proxy_memory_bytes,
        egress_proxy_cpus,
        egress_ca,
        egress_allowed_cidrs,
        egress_upstream_ca_file,
        egress_upstream_proxy,
        egress_subnet_pool,
        fs_prune_dirs,
        command_timeout,
        redis_url,
        session_lock_ttl,
        session_lock_wait,
        session_lock_refresh,
        reaper_enabled,
        reaper_interval,
        session_grace,
        max_stopped_sessions,
        running_session_max_idle,
        stop_timeout,
        host,
        port,
        log_level,
        deployment,
        helper_bin,
        output_max_bytes,
        pids_limit,
        seed_max_bytes,
        seed_max_members,
        metrics_public,
        process_output_bytes,
        max_processes,
        process_wait_max: Duration::from_secs(process_wait_max),
        stream_heartbeat: Duration::from_secs(stream_heartbeat),
        warm_pool,
        warm_pool_egress,
        warm_pool_remove_on_shutdown,
    })
}

/// A configuration from `DAIV_SANDBOX_*` pairs (names without the prefix) over an API key, for
/// in-process tests; panics on an invalid test setup.
#[cfg(any(test, feature = "test-util"))]
pub fn for_tests(api_key: &str, extra: &[(&str, &str)]) -> std::sync::Arc<Config> {
    use std::collections::HashMap;

    let mut env: HashMap<String, String> = HashMap::from([("API_KEY".into(), api_key.into())]);
    for (k, v) in extra {
        env.insert(k.to_string(), v.to_string());
    }
    match load(&env) {
        Ok(c) => std::sync::Arc::new(c),
        Err(e) => panic!("test config invalid: {e}"),
    }
}
