//! The MCP endpoint (`/mcp`) driven by the official MCP Python SDK (`mcp` on PyPI, pinned in
//! integration/python/requirements.txt), as a user's program drives it: streamable HTTP with
//! `ClientSession`, stateful and stateless, the 2025 handshake and the 2026 `server/discover`,
//! and the stdio bridge (`daiv-sandbox mcp`) spawned by the SDK's `stdio_client`.
//!
//! The client side is integration/python/mcp_driver.py: each test runs one of its scenarios
//! against a service it starts, and asserts on the JSON the scenario prints (and on what the
//! service, the sandbox, the upstream and Docker show afterwards). The venv comes from
//! scripts/ensure-python-venv.sh (`make test` and `make test-e2e SUITE=mcp` run it first); a
//! venv that cannot be made fails the test with the command that makes it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;

use anyhow::{Context, Result, bail};
use e2e::egress::EgressStack;
use e2e::python::{repo_root, venv_python};
use e2e::{
    BUSYBOX, ControlPlane, DEBIAN, DeploymentGuard, Session, containers_but_workers, docker,
    networks_with, require_image, volumes_but_shared_helper,
};
use reqwest::Method;
use serde_json::{Value, json};

/// The tools `tools/list` serves, in order (docs/api/mcp.md lists the same).
const TOOLS: &[&str] = &[
    "session_create",
    "session_close",
    "run",
    "read",
    "write",
    "edit",
    "grep",
    "glob",
    "ls",
    "process_start",
    "process_output",
    "process_kill",
    "port_url",
    "egress_update",
    "snapshot",
    "fork",
    "pause",
    "run_code",
];

/// The egress credential of the agent turn, and the one `egress_update` replaces it with.
const SECRET: &str = "ghp_mcpTurnSecret0123456789abcdef";
const SECRET_UPDATED: &str = "ghp_mcpUpdatedSecret9876543210fedc";

/// The turn's file after its edit, as `read` pages it (lines, without the last newline).
const EDITED: &str = "GREETING = 'bonjour'\nprint(GREETING)";

/// JSON-RPC's invalid params.
const INVALID_PARAMS: i64 = -32602;

/// The venv's python with the pinned SDK (made once per test process).
fn python() -> &'static Path {
    static PYTHON: OnceLock<PathBuf> = OnceLock::new();
    PYTHON.get_or_init(|| venv_python(None))
}

/// The service's binary, as the harness finds it (`DAIV_SANDBOX_BIN`, else beside this test's
/// target directory).
fn service_binary() -> PathBuf {
    if let Ok(p) = std::env::var("DAIV_SANDBOX_BIN") {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().unwrap_or_default();
    exe.parent()
        .and_then(Path::parent)
        .map(|d| d.join("daiv-sandbox"))
        .unwrap_or_default()
}

/// Runs a scenario of integration/python/mcp_driver.py against `cp`'s `/mcp` with `params`;
/// the JSON it prints, or an error with everything it said.
async fn drive(cp: &ControlPlane, scenario: &str, params: Value) -> Result<Value> {
    let python = python().to_path_buf();
    let script = repo_root().join("integration/python/mcp_driver.py");
    let url = format!("{}/mcp", cp.base);
    let key = cp.key.clone();
    let scenario = scenario.to_string();
    tokio::task::spawn_blocking(move || {
        let out = Command::new(&python)
            .arg(&script)
            .arg(&scenario)
            .env("MCP_URL", &url)
            .env("MCP_KEY", &key)
            .env("MCP_PARAMS", params.to_string())
            .stdin(Stdio::null())
            .output()
            .with_context(|| format!("spawn {}", python.display()))?;
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!(
                "mcp_driver.py {scenario}: {}\nstderr:\n{stderr}\nstdout:\n{stdout}",
                out.status
            );
        }
        let last = stdout.lines().last().unwrap_or_default();
        serde_json::from_str(last).with_context(|| {
            format!("mcp_driver.py {scenario}: not JSON: {stdout}\nstderr:\n{stderr}")
        })
    })
    .await?
}

fn names(tools: &Value) -> Vec<&str> {
    tools
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|t| t["name"].as_str())
        .collect()
}

/// The listed tools: the served names in order, each with an object schema and a description,
/// the read-only ones marked.
fn assert_tools(v: &Value) {
    assert_eq!(names(&v["tools"]), TOOLS, "{v}");
    for t in v["tools"].as_array().into_iter().flatten() {
        assert_eq!(t["schema_type"], "object", "{t}");
        assert_eq!(t["described"], true, "{t}");
    }
    let read_only: Vec<&str> = v["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|t| t["read_only"] == true)
        .filter_map(|t| t["name"].as_str())
        .collect();
    assert_eq!(read_only, ["read", "grep", "glob", "ls", "process_output"]);
    let run = &v["tools"][2];
    assert_eq!(run["required"], json!(["session_id", "commands"]), "{run}");
}

/// What every initialisation shows: who the server is, that it has tools, and a call on a session
/// that does not exist answered as a result (isError, not_found), not a protocol error.
fn assert_initialised(v: &Value, protocol_version: &str) {
    assert_eq!(v["protocol_version"], protocol_version, "{v}");
    assert_eq!(v["server_name"], "daiv-sandbox", "{v}");
    assert!(
        v["server_version"].as_str().is_some_and(|s| !s.is_empty()),
        "{v}"
    );
    assert!(
        v["instructions"]
            .as_str()
            .is_some_and(|s| s.contains("session_create")),
        "{v}"
    );
    assert_eq!(v["tools_capability"], true, "{v}");
    assert_tools(v);
    let missing = &v["missing_session_call"];
    assert_eq!(missing["is_error"], true, "{v}");
    assert_eq!(missing["value"]["code"], "not_found", "{v}");
    assert!(
        missing["value"]["remediation"]
            .as_str()
            .is_some_and(|r| r.contains("session_create")),
        "{v}"
    );
}

#[tokio::test]
async fn stateful_initialise_lists_the_tools_on_an_mcp_session() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let v = drive(&cp, "init", json!({"era": "handshake"})).await?;
    assert_initialised(&v, "2025-11-25");
    let ids = v["mcp_session_ids"].as_array().cloned().unwrap_or_default();
    assert_eq!(ids.len(), 1, "one MCP session, kept across requests: {v}");

    // The 2026 era (server/discover, no MCP session) on the same endpoint.
    let v = drive(&cp, "init", json!({"era": "discover"})).await?;
    assert_initialised(&v, "2026-07-28");
    assert_eq!(v["mcp_session_ids"], json!([]), "2026: no MCP session: {v}");
    Ok(())
}

#[tokio::test]
async fn stateless_initialise_lists_the_tools_without_an_mcp_session() -> Result<()> {
    let cp = ControlPlane::start_with(&[("MCP_STATELESS", "true")]).await?;
    for (era, version) in [("handshake", "2025-11-25"), ("discover", "2026-07-28")] {
        let v = drive(&cp, "init", json!({ "era": era })).await?;
        assert_initialised(&v, version);
        assert_eq!(
            v["mcp_session_ids"],
            json!([]),
            "stateless: no Mcp-Session-Id: {v}"
        );
    }
    Ok(())
}

/// The egress of the agent turn: api.upstream.test only, with `token` injected as Authorization.
fn turn_egress(token: &str) -> Value {
    json!({
        "policy": {
            "default": "deny",
            "intercept": "all",
            "rules": [{"host": "api.upstream.test", "methods": ["GET"], "inject": "tok"}]
        },
        "secrets": {"tok": {"header": "Authorization", "value": token}}
    })
}

/// The upstream's record of the last request to `path`.
fn seen_at(up: &e2e::egress::Upstream, path: &str) -> Result<Value> {
    up.requests()?
        .into_iter()
        .rev()
        .find(|r| r["path"] == path)
        .with_context(|| format!("the upstream never saw {path}"))
}

fn result_of(run: &Value, i: usize) -> &Value {
    &run["results"][i]
}

#[tokio::test]
async fn an_agent_turn_through_the_tools_with_egress_leaves_nothing_and_no_secret() -> Result<()> {
    let EgressStack { up, cp } = EgressStack::start().await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let (head, tail) = SECRET.split_at(8);
    let v = drive(
        &cp,
        "turn",
        json!({
            "image": DEBIAN,
            "egress": turn_egress(SECRET),
            "egress_updated": turn_egress(SECRET_UPDATED),
            "upstream_url": "https://api.upstream.test",
            "secret_head": head,
            "secret_tail": tail,
        }),
    )
    .await?;
    let id = v["session_id"].as_str().context("session_id")?;

    // write: a new file; again: already_exists, as a result.
    assert_eq!(v["write"]["ok"], true, "{}", v["write"]);
    assert_eq!(v["write_again"]["is_error"], true, "{}", v["write_again"]);
    assert_eq!(v["write_again"]["value"]["code"], "already_exists");
    assert!(
        v["write_again"]["value"]["remediation"]
            .as_str()
            .is_some_and(|r| r.contains("edit"))
    );

    // run: the file runs, the environment is there, and the upstream saw the injected secret.
    let run = &v["run"];
    assert_eq!(result_of(run, 0)["exit_code"], 0, "{run}");
    assert_eq!(result_of(run, 0)["output"], "hello\nTURN=mcp\n", "{run}");
    assert_eq!(result_of(run, 1)["exit_code"], 0, "{run}");
    assert_eq!(result_of(run, 1)["output"], "200", "{run}");
    assert_eq!(
        seen_at(&up, "/mcp-turn")?["headers"]["authorization"],
        SECRET
    );
    let streamed: String = v["run_progress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["message"].as_str())
        .collect();
    assert_eq!(
        streamed, "hello\nTURN=mcp\n200",
        "both commands' output as progress: {}",
        v["run_progress"]
    );
    assert!(
        run["_text"]
            .as_str()
            .is_some_and(|t| t.contains("[exit code 0]")),
        "{run}"
    );

    // grep, edit, read, ls, glob.
    let matches = v["grep"]["matches"].as_array().cloned().unwrap_or_default();
    assert_eq!(matches.len(), 1, "{}", v["grep"]);
    assert!(
        matches[0]["path"]
            .as_str()
            .is_some_and(|p| p.ends_with("src/app.py"))
    );
    assert_eq!(matches[0]["line"], 1);
    assert_eq!(v["edit"]["occurrences"], 1, "{}", v["edit"]);
    assert_eq!(
        v["edit_missing"]["value"]["code"], "string_not_found",
        "{}",
        v["edit_missing"]
    );
    assert_eq!(v["read"]["content"], EDITED, "{}", v["read"]);
    let ls = v["ls"]["entries"].as_array().cloned().unwrap_or_default();
    assert!(
        ls.iter()
            .any(|e| e["is_dir"] == true && e["path"].as_str().is_some_and(|p| p.ends_with("src"))),
        "{}",
        v["ls"]
    );
    let globbed: Vec<&str> = v["glob"]["matches"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|e| e["path"].as_str())
        .collect();
    assert_eq!(globbed.len(), 1, "{}", v["glob"]);
    assert!(globbed[0].ends_with("src/app.py"), "{globbed:?}");

    // A background process: its output while it runs, then killed.
    let out = &v["process_output"];
    assert!(
        out["output"]
            .as_str()
            .is_some_and(|o| o.contains("tick-1\ntick-2\ntick-3")),
        "{out}"
    );
    assert_eq!(out["running"], true, "{out}");
    assert_eq!(v["process_kill"]["killed"], true);
    assert_eq!(
        v["process_after_kill"]["running"], false,
        "{}",
        v["process_after_kill"]
    );

    // egress_update: the next request carries the new credential.
    assert_eq!(v["egress_update"]["updated"], true);
    assert_eq!(v["after_update"]["exit_code"], 0, "{}", v["after_update"]);
    assert_eq!(v["after_update"]["output"], "200", "{}", v["after_update"]);
    assert_eq!(
        seen_at(&up, "/mcp-after-update")?["headers"]["authorization"],
        SECRET_UPDATED
    );

    // Snapshot, a session from it, a fork: the edited file in each.
    let snapshot = v["snapshot"]["snapshot_id"]
        .as_str()
        .context("snapshot_id")?;
    assert_eq!(v["snapshot"]["name"], "mcp-turn");
    for copy in [&v["from_snapshot"], &v["fork"]] {
        assert_eq!(copy["read"]["content"], EDITED, "{copy}");
        assert_eq!(copy["close"]["closed"], true, "{copy}");
    }
    assert_eq!(v["fork"]["session_ids"].as_array().map(Vec::len), Some(1));
    assert_ne!(v["fork"]["session_ids"][0], id);

    // pause, then a call resumes it.
    assert_eq!(v["pause"]["paused"], true);
    assert_eq!(v["after_pause"]["exit_code"], 0, "{}", v["after_pause"]);
    assert_eq!(v["after_pause"]["output"], "bonjour\n");

    // session_close, then the session is gone: isError, not_found.
    assert_eq!(v["close"]["closed"], true);
    assert_eq!(v["after_close"]["is_error"], true, "{}", v["after_close"]);
    assert_eq!(
        v["after_close"]["value"]["code"], "not_found",
        "{}",
        v["after_close"]
    );

    // The secrets are in no result and no progress notification, not in the sandbox's
    // environment, processes or files, and not in the service's logs.
    let scan = &v["secret_scan"];
    assert!(
        scan["output"]
            .as_str()
            .is_some_and(|o| o.ends_with("scan-end\n")),
        "{scan}"
    );
    for secret in [SECRET, SECRET_UPDATED] {
        assert!(
            !scan["output"].as_str().unwrap_or_default().contains(secret),
            "secret in the sandbox"
        );
        let transcript = v["transcript"].to_string();
        assert!(
            !transcript.contains(secret),
            "a secret in a tool result or notification"
        );
        assert!(v["transcript"].as_array().is_some_and(|t| t.len() > 20));
        let logs = cp.logs();
        let leak = logs.lines().find(|l| l.contains(secret));
        assert!(leak.is_none(), "a secret in the service's logs: {leak:?}");
    }

    // Nothing left: no sandbox, gateway or network, no session's workspace; what stays is
    // snapshot payloads (the fork's, without a record, is the reaper's once its forks are gone:
    // docs/api/snapshots.md), and the turn's snapshot, once deleted, is gone too.
    let label = format!("daiv.sandbox.deployment={}", cp.deployment);
    assert_eq!(
        containers_but_workers(&[&label]),
        Vec::<String>::new(),
        "containers left"
    );
    assert_eq!(
        networks_with(&[&label]),
        Vec::<String>::new(),
        "networks left"
    );
    let volumes = volumes_but_shared_helper(&[&label]);
    assert!(
        volumes.iter().all(|v| v.starts_with("daiv-snapshot-")),
        "session volumes left: {volumes:?}"
    );
    let (status, body) = cp
        .call(Method::DELETE, &format!("/snapshots/{snapshot}/"), None)
        .await?;
    assert_eq!(status, 204, "delete the snapshot: {body}");
    let (_, listed) = cp.call(Method::GET, "/snapshots/", None).await?;
    assert_eq!(listed["snapshots"], json!([]), "{listed}");
    let volumes = volumes_but_shared_helper(&[&label]);
    assert!(
        !volumes.iter().any(|v| v.contains(snapshot)),
        "the deleted snapshot's volumes: {volumes:?}"
    );
    assert!(
        docker(&[
            "image",
            "inspect",
            &format!("daiv-sandbox-snapshot:{snapshot}")
        ])
        .is_err(),
        "the deleted snapshot's image is left"
    );
    Ok(())
}

/// The progress of a long run and a cancelled run, in `era` on `cp`: its output streamed as
/// progress and in its result; the cancelled command killed (seen from the sandbox through the
/// tools, then from Docker); the session usable afterwards.
async fn progress_then_cancel(cp: &ControlPlane, era: &str, marker: u32) -> Result<()> {
    require_image(BUSYBOX);
    let _guard = DeploymentGuard(cp.deployment.clone());
    let v = drive(
        cp,
        "progress_cancel",
        json!({"image": BUSYBOX, "marker": marker, "era": era}),
    )
    .await?;
    let session = Session {
        id: v["session_id"].as_str().context("session_id")?.to_string(),
    };

    let lines = "line-1\nline-2\nline-3\nline-4\nline-5\nend\n";
    assert_eq!(
        v["long_run"]["results"][0]["output"], lines,
        "{}",
        v["long_run"]
    );
    let progress = v["long_run_progress"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let streamed: String = progress
        .iter()
        .filter_map(|p| p["message"].as_str())
        .collect();
    // The whole output as progress, in pieces as it was printed, every piece before the result
    // (a notification sent after it reaches no client: the request is over).
    assert_eq!(streamed, lines, "the output as progress: {progress:?}");
    assert_eq!(
        v["short_runs_progress"],
        json!(["a\nz\n", "a\nz\n", "a\nz\n", "a\nz\n", "a\nz\n"]),
        "the output printed as a command ends, as progress"
    );
    assert!(
        progress.len() >= 4,
        "printed over 1.5 s, streamed in pieces: {progress:?}"
    );
    let values: Vec<f64> = progress
        .iter()
        .filter_map(|p| p["progress"].as_f64())
        .collect();
    assert!(
        values.windows(2).all(|w| w[0] < w[1]),
        "progress increases: {values:?}"
    );

    let cancel = &v["cancel"];
    assert_eq!(
        cancel["running_before"], 1,
        "the command ran before the cancel: {cancel}"
    );
    assert_eq!(cancel["call_finished"], false, "{cancel}");
    assert_eq!(
        cancel["remaining_after"], 0,
        "the cancelled command still runs: {cancel}"
    );
    let ps = docker(&[
        "exec",
        &session.id,
        "sh",
        "-c",
        "{ for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done; } 2>/dev/null",
    ])?;
    let sleeper = format!("sleep {marker}");
    assert!(
        !ps.lines().any(|l| l.starts_with(&sleeper)),
        "{sleeper} still runs:\n{ps}"
    );
    assert_eq!(
        v["after_cancel"]["output"], "still-usable\n",
        "{}",
        v["after_cancel"]
    );
    drop(session);
    Ok(())
}

#[tokio::test]
async fn stateful_run_streams_progress_and_a_cancelled_call_kills_its_command() -> Result<()> {
    let cp = ControlPlane::start().await?;
    progress_then_cancel(&cp, "handshake", 987).await
}

#[tokio::test]
async fn stateless_run_streams_progress_and_a_hung_up_call_kills_its_command() -> Result<()> {
    let cp = ControlPlane::start_with(&[("MCP_STATELESS", "true")]).await?;
    // The 2026 client cancels a call by closing its stream (no MCP session to notify).
    progress_then_cancel(&cp, "discover", 989).await
}

#[tokio::test]
async fn bad_arguments_and_unknown_tools_are_protocol_errors_naming_the_field() -> Result<()> {
    let cp = ControlPlane::start().await?;
    let v = drive(&cp, "errors", json!({})).await?;
    for (case, names) in [
        ("commands_not_a_list", "commands"),
        ("commands_missing", "commands"),
        ("unknown_field", "pth"),
        ("wrong_type", "limit"),
        ("unknown_tool", "no_such_tool"),
    ] {
        let e = &v[case];
        assert_eq!(e["raised"], true, "{case}: not a protocol error: {e}");
        assert_eq!(e["code"], INVALID_PARAMS, "{case}: {e}");
        assert!(
            e["message"].as_str().is_some_and(|m| m.contains(names)),
            "{case}: the message names {names:?}: {e}"
        );
    }
    assert_eq!(
        v["still_works"]["value"]["code"], "not_found",
        "{}",
        v["still_works"]
    );
    Ok(())
}

/// An MCP initialize request, as a client's first POST.
fn initialize_body() -> Value {
    json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {
            "protocolVersion": "2025-11-25",
            "capabilities": {},
            "clientInfo": {"name": "e2e", "version": "0"}
        }
    })
}

#[tokio::test]
async fn a_missing_key_is_401_and_a_wrong_key_403_showing_nothing() -> Result<()> {
    let cp = ControlPlane::start().await?;
    for path in ["/mcp", "/api/v1/mcp"] {
        let url = format!("{}{path}", cp.base);
        let post = |key: Option<&str>| {
            let mut req = cp
                .http()
                .post(&url)
                .header("Accept", "application/json, text/event-stream")
                .json(&initialize_body());
            if let Some(k) = key {
                req = req.header("X-API-Key", k);
            }
            req.send()
        };
        let r = post(None).await?;
        assert_eq!(r.status().as_u16(), 401, "{path} without a key");
        assert!(r.headers().contains_key("www-authenticate"));
        let body = r.text().await?;
        assert!(
            !body.contains("session_create") && !body.contains("daiv-sandbox"),
            "{body}"
        );
        let r = post(Some("not-the-key")).await?;
        assert_eq!(r.status().as_u16(), 403, "{path} with a wrong key");
        let body = r.text().await?;
        assert!(!body.contains("session_create"), "{body}");
        // A wrong key as a bearer token: the same.
        let r = cp
            .http()
            .post(&url)
            .header("Accept", "application/json, text/event-stream")
            .bearer_auth("not-the-key")
            .json(&initialize_body())
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 403, "{path} with a wrong bearer token");
        // The key, as a bearer token: initialised.
        let r = cp
            .http()
            .post(&url)
            .header("Accept", "application/json, text/event-stream")
            .bearer_auth(&cp.key)
            .json(&initialize_body())
            .send()
            .await?;
        assert_eq!(r.status().as_u16(), 200, "{path} with the key");
        assert!(r.text().await?.contains("daiv-sandbox"));
    }
    Ok(())
}

#[tokio::test]
async fn the_stdio_bridge_initialises_and_runs_a_tool() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let dir = tempfile::tempdir()?;
    let key_file = dir.path().join("key");
    std::fs::write(&key_file, format!("{}\n", cp.key))?;
    let bin = service_binary();
    let v = drive(
        &cp,
        "stdio",
        json!({
            "bin": bin.display().to_string(),
            "url": format!("{}/mcp", cp.base),
            "key_file": key_file.display().to_string(),
            "image": BUSYBOX,
        }),
    )
    .await?;
    assert_eq!(v["server_name"], "daiv-sandbox", "{v}");
    assert_eq!(v["protocol_version"], "2025-11-25", "{v}");
    let tools: Vec<&str> = v["tools"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(tools, TOOLS);
    let run = &v["run"]["results"][0];
    assert_eq!(run["output"], "via-stdio\ndone-stdio\n", "{run}");
    assert_eq!(run["exit_code"], 0);
    let streamed: String = v["run_progress"]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|p| p["message"].as_str())
        .collect();
    assert_eq!(
        streamed, "via-stdio\ndone-stdio\n",
        "the output as progress, through the bridge: {v}"
    );
    assert_eq!(v["bad_args"]["raised"], true, "{v}");
    assert_eq!(v["bad_args"]["code"], INVALID_PARAMS, "{v}");
    assert_eq!(v["close"]["closed"], true, "{v}");
    let label = format!("daiv.sandbox.deployment={}", cp.deployment);
    assert_eq!(
        containers_but_workers(&[&label]),
        Vec::<String>::new(),
        "sessions left"
    );
    Ok(())
}

#[tokio::test]
async fn run_code_keeps_state_returns_charts_as_images_and_names_a_session_without_one()
-> Result<()> {
    const IMAGE: &str = "daiv-sandbox-code-interpreter:local";
    require_image(IMAGE);
    require_image(DEBIAN);
    let cp = ControlPlane::start().await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let v = drive(&cp, "code", json!({"image": IMAGE, "plain_image": DEBIAN})).await?;
    assert_eq!(v["state"]["_text"], "Out: 40\n", "{v}");
    assert_eq!(v["state"]["results"][0]["text"], "40", "{v}");
    // The figure reaches the model as MCP image content (a PNG), not as base64 text.
    assert_eq!(
        v["chart_images"],
        json!([{"mime": "image/png", "head": "iVBORw0KGgoA"}]),
        "{v}"
    );
    assert_eq!(v["error"]["error"]["name"], "ZeroDivisionError", "{v}");
    let tb = v["error"]["_text"].as_str().unwrap_or_default();
    assert!(
        tb.contains("ZeroDivisionError") && !tb.contains('\u{1b}'),
        "{v}"
    );
    assert_eq!(v["timeout"]["error"]["name"], "TimeoutError", "{v}");
    assert_eq!(v["after_timeout"]["results"][0]["text"], "20", "{v}");
    // An image without the interpreter: a tool failure that says why.
    assert_eq!(v["plain"]["is_error"], true, "{v}");
    assert!(
        v["plain"]["text"]
            .as_str()
            .is_some_and(|t| t.contains("no code interpreter")),
        "{v}"
    );
    let label = format!("daiv.sandbox.deployment={}", cp.deployment);
    assert_eq!(containers_but_workers(&[&label]), Vec::<String>::new());
    Ok(())
}
