use std::collections::HashMap;

use std::time::Duration;

use super::*;

#[test]
fn upstream_proxy_is_validated_and_never_echoed() {
    let ok = load(&env(&[
        ("API_KEY", "k"),
        ("EGRESS_UPSTREAM_PROXY", "http://u:pw@proxy.test:3128"),
    ]));
    let c = ok.expect("valid proxy");
    assert_eq!(
        c.egress.upstream_proxy.as_ref().map(Secret::expose),
        Some("http://u:pw@proxy.test:3128")
    );
    assert!(!format!("{c:?}").contains("pw@"));
    let bad = load(&env(&[
        ("API_KEY", "k"),
        ("EGRESS_UPSTREAM_PROXY", "socks5://u:s3cret@x"),
    ]));
    let e = bad.err().map(|e| e.to_string()).unwrap_or_default();
    assert!(
        e.contains("EGRESS_UPSTREAM_PROXY") && !e.contains("s3cret"),
        "{e}"
    );
}

#[test]
fn plain_http_hosts_are_off_by_default_and_exact_names() {
    let c = load(&env(&[("API_KEY", "k")])).expect("defaults");
    assert!(c.egress.plain_http_hosts.is_empty());
    let c = load(&env(&[
        ("API_KEY", "k"),
        ("EGRESS_PLAIN_HTTP_HOSTS", "GitLab:8929, registry.test"),
    ]))
    .expect("valid list");
    let shown: Vec<String> = c
        .egress
        .plain_http_hosts
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(shown, ["gitlab:8929", "registry.test"]);
    for bad in ["*.gitlab.test", "gitlab:0", "git lab"] {
        let e = errors(&[("API_KEY", "k"), ("EGRESS_PLAIN_HTTP_HOSTS", bad)]);
        assert!(
            e.len() == 1 && e[0].starts_with("DAIV_SANDBOX_EGRESS_PLAIN_HTTP_HOSTS="),
            "{bad}: {e:?}"
        );
    }
}

fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

fn errors(pairs: &[(&str, &str)]) -> Vec<String> {
    match load(&env(pairs)) {
        Ok(_) => Vec::new(),
        Err(ConfigError(e)) => e,
    }
}

#[test]
fn defaults_match_the_reference_table() -> Result<(), ConfigError> {
    let c = load(&env(&[("API_KEY", "k")]))?;
    assert_eq!(c.server.api_v1_str, "/api/v1");
    assert_eq!(c.telemetry.environment, Environment::Production);
    assert_eq!(c.sessions.runtime, Runtime::Runc);
    assert_eq!((c.sessions.run_uid, c.sessions.run_gid), (1000, 1000));
    assert_eq!(c.egress.proxy_port, 8080);
    assert_eq!(c.egress.proxy_runtime, Runtime::Runc);
    assert!(c.egress.ca.is_none());
    assert_eq!(c.sessions.command_timeout, None);
    assert_eq!(c.coordination.lock_ttl, Duration::from_secs(900));
    assert_eq!(c.coordination.lock_wait, Duration::from_secs(30));
    assert_eq!(c.coordination.lock_refresh, Duration::from_secs(30));
    assert!(c.reaper.enabled);
    assert_eq!(c.reaper.interval, Duration::from_secs(600));
    assert_eq!(c.reaper.session_grace, Duration::from_secs(43_200));
    assert_eq!(c.reaper.max_stopped_sessions, 50);
    assert_eq!(
        c.reaper.running_session_max_idle,
        Some(Duration::from_secs(14_400))
    );
    assert_eq!(c.sessions.stop_timeout, Duration::from_secs(2));
    assert_eq!(c.server.port, 8000);
    assert_eq!(c.server.host.to_string(), "0.0.0.0");
    assert_eq!(c.telemetry.log_level, LogLevel::Info);
    assert!(c.sessions.fs_prune_dirs.iter().any(|d| d == ".git"));
    assert!(!c.sessions.fs_prune_dirs.iter().any(|d| d == "node_modules"));
    Ok(())
}

#[test]
fn api_key_is_required_and_never_printed() {
    let e = errors(&[]);
    assert!(
        e.iter().any(|l| l.contains("DAIV_SANDBOX_API_KEY")),
        "{e:?}"
    );
    let c = load(&env(&[("API_KEY", "hunter2")]));
    let printed = format!("{c:?}");
    assert!(!printed.contains("hunter2"), "{printed}");
}

#[test]
fn every_bad_variable_is_reported_by_name() {
    let e = errors(&[
        ("API_KEY", "k"),
        ("PORT", "eighty"),
        ("RUNTIME", "kata"),
        ("REAPER_ENABLED", "maybe"),
        ("SESSION_LOCK_WAIT_SECONDS", "-1"),
        ("LOG_LEVEL", "verbose"),
        ("SENTRY_TRACES_SAMPLE_RATE", "2"),
        ("EGRESS_PROXY_CPUS", "0"),
    ]);
    for name in [
        "PORT",
        "RUNTIME",
        "REAPER_ENABLED",
        "SESSION_LOCK_WAIT_SECONDS",
        "LOG_LEVEL",
        "SENTRY_TRACES_SAMPLE_RATE",
        "EGRESS_PROXY_CPUS",
    ] {
        assert!(
            e.iter().any(|l| l.starts_with(&format!("{PREFIX}{name}"))),
            "{name} missing from {e:?}"
        );
    }
}

#[test]
fn egress_ca_needs_both_files() {
    let e = errors(&[("API_KEY", "k"), ("EGRESS_CA_CERT_FILE", "/etc/hostname")]);
    assert!(
        e.iter().any(|l| l.contains("must be set together")),
        "{e:?}"
    );
    let e = errors(&[
        ("API_KEY", "k"),
        ("EGRESS_CA_CERT_FILE", "/nonexistent/ca.crt"),
        ("EGRESS_CA_KEY_FILE", "/nonexistent/ca.key"),
    ]);
    assert_eq!(e.len(), 2, "{e:?}");
}

#[test]
fn zero_disables_timeouts_and_comma_lists_replace_defaults() -> Result<(), ConfigError> {
    let c = load(&env(&[
        ("API_KEY", "k"),
        ("COMMAND_TIMEOUT", "30"),
        ("RUNNING_SESSION_MAX_IDLE_SECONDS", "0"),
        ("FS_PRUNE_DIRS", " .git , node_modules,,"),
        ("SESSION_LOCK_WAIT_SECONDS", "0.5"),
        ("LOG_LEVEL", "WARNING"),
        ("API_V1_STR", "/v2/"),
    ]))?;
    assert_eq!(c.sessions.command_timeout, Some(Duration::from_secs(30)));
    assert_eq!(c.reaper.running_session_max_idle, None);
    assert_eq!(c.sessions.fs_prune_dirs, vec![".git", "node_modules"]);
    assert_eq!(c.coordination.lock_wait, Duration::from_millis(500));
    assert_eq!(c.telemetry.log_level.directive(), "warn");
    assert_eq!(c.server.api_v1_str, "/v2");
    Ok(())
}

#[test]
fn secrets_dir_is_read_and_env_wins() -> std::io::Result<()> {
    let dir = std::env::temp_dir().join(format!("daiv-secrets-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("daiv_sandbox_run_uid"), "4242\n")?;
    let src = ProcessEnv::with_secrets_dir(&dir);
    assert_eq!(src.get("RUN_UID").as_deref(), Some("4242"));
    assert_eq!(src.get("RUN_GID"), None);
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}

#[test]
fn unknown_settings_are_harmless() -> Result<(), ConfigError> {
    // DAIV's swarm guide still sets the reference's retired `KEEP_TEMPLATE`; settings this
    // version does not know must neither stop the service nor change a known default.
    let c = load(&env(&[
        ("API_KEY", "k"),
        ("KEEP_TEMPLATE", "true"),
        ("NO_SUCH_SETTING", "not even a boolean"),
    ]))?;
    let defaults = load(&env(&[("API_KEY", "k")]))?;
    assert_eq!(format!("{c:?}"), format!("{defaults:?}"));
    Ok(())
}

#[test]
fn a_prefix_cannot_shadow_a_route_at_the_root() {
    for prefix in ["/session", "/-/x", "/docs", "/metrics/v1", "/openapi.json"] {
        let e = errors(&[("API_KEY", "k"), ("API_V1_STR", prefix)]);
        assert!(
            e.iter().any(|e| e.contains("API_V1_STR")),
            "{prefix}: {e:?}"
        );
    }
    for prefix in ["/api/v1", "/sessions", "/v2", ""] {
        let e = errors(&[("API_KEY", "k"), ("API_V1_STR", prefix)]);
        assert!(e.is_empty(), "{prefix}: {e:?}");
    }
}

#[test]
fn commands_never_share_the_helpers_uid_or_root() {
    let c = load(&env(&[("API_KEY", "k")])).expect("defaults");
    assert_eq!(c.sessions.helper_uid, sessions::DEFAULT_HELPER_UID);
    for bad in [
        &[("HELPER_UID", "0")][..],
        &[("HELPER_UID", "1000")][..],
        &[("RUN_UID", "4242"), ("HELPER_UID", "4242")][..],
        &[("RUN_UID", "0")][..],
    ] {
        let mut pairs = vec![("API_KEY", "k")];
        pairs.extend_from_slice(bad);
        let e = errors(&pairs);
        assert!(
            e.iter()
                .any(|e| e.contains("HELPER_UID") || e.contains("RUN_UID")),
            "{bad:?}: {e:?}"
        );
    }
    let c = load(&env(&[("API_KEY", "k"), ("HELPER_UID", "5000")])).expect("valid");
    assert_eq!(c.sessions.helper_uid, 5000);
}

#[test]
fn admission_defaults_and_bounds() -> Result<(), ConfigError> {
    let c = load(&env(&[("API_KEY", "k")]))?;
    let a = &c.admission;
    assert_eq!(
        (a.creates, a.seeds, a.fs_ops, a.fs_ops_per_session),
        (8, 4, 32, 8)
    );
    assert_eq!(a.queue_wait, Duration::from_secs(30));
    assert_eq!(a.queue_length, 64);
    let c = load(&env(&[
        ("API_KEY", "k"),
        ("ADMISSION_QUEUE_SECONDS", "0.25"),
        ("ADMISSION_QUEUE_LENGTH", "0"),
    ]))?;
    assert_eq!(c.admission.queue_wait, Duration::from_millis(250));
    assert_eq!(c.admission.queue_length, 0);
    let e = errors(&[
        ("API_KEY", "k"),
        ("MAX_CONCURRENT_CREATES", "0"),
        ("MAX_CONCURRENT_SEEDS", "5000"),
        ("MAX_CONCURRENT_FS_OPS", "lots"),
        ("MAX_CONCURRENT_FS_OPS_PER_SESSION", "-1"),
        ("ADMISSION_QUEUE_SECONDS", "-1"),
        ("ADMISSION_QUEUE_LENGTH", "100000"),
    ]);
    for name in [
        "MAX_CONCURRENT_CREATES",
        "MAX_CONCURRENT_SEEDS",
        "MAX_CONCURRENT_FS_OPS=",
        "MAX_CONCURRENT_FS_OPS_PER_SESSION",
        "ADMISSION_QUEUE_SECONDS",
        "ADMISSION_QUEUE_LENGTH",
    ] {
        assert!(
            e.iter().any(|l| l.starts_with(&format!("{PREFIX}{name}"))),
            "{name} not reported: {e:?}"
        );
    }
    Ok(())
}

#[test]
fn mcp_sessions_are_capped_and_expire_by_default() -> Result<(), ConfigError> {
    let c = load(&env(&[("API_KEY", "k")]))?;
    assert_eq!(c.mcp.max_sessions, 1000);
    assert_eq!(c.mcp.session_idle, Duration::from_secs(120));
    let e = errors(&[
        ("API_KEY", "k"),
        ("MCP_MAX_SESSIONS", "0"),
        ("MCP_SESSION_IDLE_SECONDS", "0"),
    ]);
    for name in ["MCP_MAX_SESSIONS", "MCP_SESSION_IDLE_SECONDS"] {
        assert!(
            e.iter().any(|l| l.starts_with(&format!("{PREFIX}{name}"))),
            "{name} not reported: {e:?}"
        );
    }
    Ok(())
}

#[test]
fn the_opensandbox_api_is_off_by_default_and_its_port_is_checked() {
    let c = load(&env(&[("API_KEY", "k")])).expect("defaults");
    assert_eq!(c.opensandbox.port, None);
    let c = load(&env(&[("API_KEY", "k"), ("OPENSANDBOX_PORT", "8090")])).expect("valid");
    assert_eq!(c.opensandbox.port, Some(8090));
    for v in ["0", "http", "70000"] {
        let e = errors(&[("API_KEY", "k"), ("OPENSANDBOX_PORT", v)]);
        assert!(
            e.iter().any(|l| l.contains("OPENSANDBOX_PORT")),
            "{v}: {e:?}"
        );
    }
}

#[test]
fn the_e2b_api_is_off_by_default_and_its_templates_are_checked() {
    let c = load(&env(&[("API_KEY", "k")])).expect("defaults");
    assert_eq!(c.e2b.port, None);
    assert_eq!(
        c.e2b.templates.get("base").map(String::as_str),
        Some(e2b::DEFAULT_BASE_IMAGE)
    );
    assert_eq!(c.e2b.default_network, DefaultNetwork::None);
    let c = load(&env(&[
        ("API_KEY", "k"),
        ("E2B_PORT", "49983"),
        ("E2B_TEMPLATES", r#"{"py": "python:3.12"}"#),
    ]))
    .expect("valid");
    assert_eq!(c.e2b.port, Some(49983));
    assert_eq!(c.e2b.templates.len(), 1);
    // `allow` needs the gateway, so the egress CA.
    let e = errors(&[("API_KEY", "k"), ("E2B_DEFAULT_NETWORK", "allow")]);
    assert!(e.iter().any(|l| l.contains("EGRESS_CA")), "{e:?}");
    for (k, v) in [
        ("E2B_PORT", "0"),
        ("E2B_PORT", "http"),
        ("E2B_TEMPLATES", "[1]"),
        ("E2B_TEMPLATES", r#"{"bad name": "x"}"#),
        ("E2B_TEMPLATES", r#"{"base": " "}"#),
        ("E2B_DEFAULT_NETWORK", "open"),
    ] {
        let e = errors(&[("API_KEY", "k"), (k, v)]);
        assert!(e.iter().any(|l| l.contains(k)), "{k}={v}: {e:?}");
    }
}

#[test]
fn a_uid_range_is_two_uids_and_never_holds_root_or_the_helper() {
    let c = load(&env(&[("API_KEY", "k")])).expect("defaults");
    assert_eq!(c.sessions.run_uid_range, None);
    let c = load(&env(&[
        ("API_KEY", "k"),
        ("RUN_UID_RANGE", " 200000-265535 "),
    ]))
    .expect("valid");
    assert_eq!(c.sessions.run_uid_range, Some((200_000, 265_535)));
    for bad in [
        "200000",
        "0-10",
        "20-10",
        "a-b",
        "1-",
        "65000-66000",
        "-5-10",
    ] {
        let e = errors(&[("API_KEY", "k"), ("RUN_UID_RANGE", bad)]);
        assert!(
            e.iter().any(|e| e.contains("RUN_UID_RANGE")),
            "{bad}: {e:?}"
        );
    }
}
