//! The code interpreter (`daiv-sandbox-code-interpreter:local`, E2B's `code-interpreter-v1`):
//! E2B's `e2b-code-interpreter` SDK, unchanged, runs a notebook's cells against the service's
//! E2B API (the oldest and newest of the supported range, pinned in
//! integration/python/e2b-code-interpreter-*.txt, each in its own venv from
//! scripts/ensure-python-venv.sh); the native `POST /session/{id}/code` and its contexts; MCP's
//! `run_code` (integration/python/mcp_driver.py's `code`). Each asserts on what the client saw
//! and on what Docker shows afterwards.

use anyhow::{Context, Result};
use e2e::egress::EgressStack;
use e2e::python::{drive_script, venv_python};
use e2e::{
    ControlPlane, DEBIAN, DeploymentGuard, containers_but_workers, free_port, require_image,
};
use serde_json::{Value, json};

const IMAGE: &str = "daiv-sandbox-code-interpreter:local";
const NEWEST: &str = "e2b-code-interpreter-2.11.5";
const OLDEST: &str = "e2b-code-interpreter-2.9.0";

struct E2bService {
    cp: ControlPlane,
    url: String,
}

async fn service(extra: &[(&str, &str)]) -> Result<E2bService> {
    require_image(IMAGE);
    require_image(DEBIAN);
    let port = free_port().to_string();
    let mut env: Vec<(&str, &str)> = vec![("E2B_PORT", &port)];
    env.extend_from_slice(extra);
    let cp = ControlPlane::start_with(&env).await?;
    Ok(E2bService {
        url: format!("http://127.0.0.1:{port}"),
        cp,
    })
}

/// Runs `scenario` of code_interpreter_driver.py with `sdk`'s venv; the JSON it printed.
async fn drive(sdk: &str, svc: &E2bService, scenario: &str, params: Value) -> Result<Value> {
    let env = [
        ("E2B_API_KEY", svc.cp.key.clone()),
        ("E2B_API_URL", svc.url.clone()),
        ("E2B_SANDBOX_URL", svc.url.clone()),
        ("E2B_VALIDATE_API_KEY", "false".to_string()),
        ("E2B_PARAMS", params.to_string()),
    ];
    let env = env.map(|(k, v)| (k.to_string(), v)).to_vec();
    drive_script(
        venv_python(Some(sdk)),
        "code_interpreter_driver.py",
        scenario,
        env,
    )
    .await
}

fn assert_nothing_left(cp: &ControlPlane) {
    let label = format!("daiv.sandbox.deployment={}", cp.deployment);
    let left = containers_but_workers(&[&label]);
    assert!(left.is_empty(), "containers left: {left:?}");
}

async fn notebook(sdk: &str, extra: &[(&str, &str)]) -> Result<()> {
    let svc = service(extra).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let v = drive(sdk, &svc, "notebook", json!({})).await?;
    // E2B's user: its name, its home, where commands start.
    assert_eq!(
        v["whoami"],
        json!(["user", "/home/user", "/home/user"]),
        "{v}"
    );
    // State across cells.
    assert_eq!(v["state"], "42", "{v}");
    // A matplotlib figure is a PNG result; a DataFrame is HTML and text, the main result.
    assert_eq!(v["chart_png_prefix"], "iVBORw0KGgoA", "{v}");
    assert!(
        v["chart_formats"].to_string().contains("png"),
        "chart formats: {v}"
    );
    assert_eq!(v["df_html_has_table"], true, "{v}");
    assert!(
        v["df_text"]
            .as_str()
            .is_some_and(|t| t.contains('a') && t.contains('4')),
        "{v}"
    );
    // stdout and stderr, through their callbacks, in the order printed (and flushed: the
    // kernel buffers each stream on its own).
    assert_eq!(
        v["streams"],
        json!([["out", "one\n"], ["err", "two\n"], ["out", "three\n"]]),
        "{v}"
    );
    // An exception: its name, value and a traceback through the function.
    assert_eq!(v["error"]["name"], "ZeroDivisionError", "{v}");
    assert_eq!(v["error"]["value"], "division by zero", "{v}");
    assert_eq!(v["error"]["traceback_has_f"], true, "{v}");
    // A timeout is the SDK's, well before the cell's 60 s, and the context is still usable
    // with its state.
    assert_eq!(v["timeout"], "TimeoutException", "{v}");
    assert!(
        v["timeout_seconds"].as_f64().is_some_and(|s| s < 30.0),
        "{v}"
    );
    assert_eq!(v["after_timeout"], "80", "{v}");
    // Two contexts apart, each with its own working directory; restart loses state; a removed
    // context is gone from the list.
    assert_eq!(v["ctx_x"], "'other'", "{v}");
    assert_eq!(v["default_x"], "40", "{v}");
    assert_eq!(v["ctx_cwd"], "'/tmp'", "{v}");
    assert_eq!(v["contexts"], json!([false, true]), "{v}");
    assert_eq!(v["after_restart"], "False", "{v}");
    assert_eq!(v["contexts_after_remove"], json!([]), "{v}");
    // Environment variables for one execution only.
    assert_eq!(v["env"], "'v1'", "{v}");
    assert_eq!(v["env_after"], Value::Null, "{v}");
    // bash as a language; a file the SDK wrote, read by a cell in the default working directory.
    assert_eq!(v["bash"], json!(["written by the SDK\n"]), "{v}");
    assert_eq!(v["python_reads_sdk_file"], "'written by the SDK'", "{v}");
    assert_nothing_left(&svc.cp);
    Ok(())
}

#[tokio::test]
async fn the_newest_sdk_runs_a_notebook() -> Result<()> {
    notebook(NEWEST, &[]).await
}

#[tokio::test]
async fn the_oldest_sdk_runs_a_notebook() -> Result<()> {
    notebook(OLDEST, &[]).await
}

#[tokio::test]
async fn the_newest_sdk_runs_a_notebook_on_gvisor() -> Result<()> {
    notebook(NEWEST, &[("RUNTIME", "runsc")]).await
}

/// Each NDJSON line of a native `/code` answer.
fn lines(body: &str) -> Vec<Value> {
    body.lines()
        .map(|l| serde_json::from_str(l).unwrap_or(Value::Null))
        .collect()
}

#[tokio::test]
async fn the_native_route_runs_cells_in_contexts_and_a_plain_image_says_it_has_none() -> Result<()>
{
    require_image(IMAGE);
    let cp = ControlPlane::start().await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let s = cp.session_of(IMAGE).await?;
    let code = |body: Value| {
        cp.request(reqwest::Method::POST, &format!("/session/{}/code", s.id))
            .json(&body)
            .send()
    };
    // At once after the create: the call waits for the interpreter to listen.
    let r = code(json!({"code": "y = 6\nprint('hi')\ny * 7"})).await?;
    assert_eq!(r.status(), 200);
    assert_eq!(
        r.headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok()),
        Some("application/x-ndjson")
    );
    let got = lines(&r.text().await?);
    let kinds: Vec<&str> = got.iter().filter_map(|l| l["type"].as_str()).collect();
    assert_eq!(
        kinds,
        [
            "number_of_executions",
            "stdout",
            "result",
            "end_of_execution"
        ],
        "{got:?}"
    );
    assert_eq!(got[1]["text"], "hi\n");
    assert_eq!(got[2]["text"], "42");
    assert_eq!(got[2]["is_main_result"], true);

    // A native timeout interrupts the kernel and says so; the state stays.
    let got = lines(
        &code(json!({"code": "import time\ntime.sleep(60)", "timeout": 1}))
            .await?
            .text()
            .await?,
    );
    assert!(
        got.iter()
            .any(|l| l["type"] == "error" && l["name"] == "TimeoutError"),
        "{got:?}"
    );
    let got = lines(&code(json!({"code": "y"})).await?.text().await?);
    assert!(got.iter().any(|l| l["text"] == "6"), "{got:?}");

    // Contexts: made, listed, used, deleted; an unknown one is a 404.
    let (status, ctx) = cp
        .call(
            reqwest::Method::POST,
            &format!("/session/{}/code/contexts", s.id),
            Some(json!({"cwd": "/workspace"})),
        )
        .await?;
    assert_eq!(status, 200, "{ctx}");
    let ctx_id = ctx["id"].as_str().context("context id")?.to_string();
    assert_eq!(ctx["cwd"], "/workspace");
    assert_eq!(ctx["language"], "python");
    let got = lines(
        &code(json!({"code": "import os\nos.getcwd()", "context_id": ctx_id}))
            .await?
            .text()
            .await?,
    );
    assert!(got.iter().any(|l| l["text"] == "'/workspace'"), "{got:?}");
    let (status, list) = cp
        .call(
            reqwest::Method::GET,
            &format!("/session/{}/code/contexts", s.id),
            None,
        )
        .await?;
    assert_eq!(status, 200);
    assert!(list.to_string().contains(&ctx_id), "{list}");
    let (status, _) = cp
        .call(
            reqwest::Method::DELETE,
            &format!("/session/{}/code/contexts/{ctx_id}", s.id),
            None,
        )
        .await?;
    assert_eq!(status, 204);
    let r = code(json!({"code": "1", "context_id": ctx_id})).await?;
    assert_eq!(r.status(), 404);
    // Bad input is the interpreter's clear 400.
    let r = code(json!({"code": "1", "env_vars": {"A-B": "x"}})).await?;
    assert_eq!(r.status(), 400);
    assert!(r.text().await?.contains("env_vars"));
    // Without the key: refused before the sandbox.
    let r = cp
        .http()
        .post(cp.url(&format!("/session/{}/code", s.id)))
        .json(&json!({"code": "1"}))
        .send()
        .await?;
    assert_eq!(r.status(), 403);

    // The kernel runs as the sandbox user, never root.
    let got = lines(
        &code(json!({"code": "import os\nos.getuid()"}))
            .await?
            .text()
            .await?,
    );
    assert!(got.iter().any(|l| l["text"] == "1000"), "{got:?}");

    // A session of an image without the interpreter: a conflict that says why.
    let plain = cp.session_of(DEBIAN).await?;
    let r = cp
        .request(
            reqwest::Method::POST,
            &format!("/session/{}/code", plain.id),
        )
        .json(&json!({"code": "1"}))
        .send()
        .await?;
    assert_eq!(r.status(), 409);
    assert!(r.text().await?.contains("no code interpreter"));
    assert_eq!(cp.force_close(&plain).await?, 204);
    assert_eq!(cp.force_close(&s).await?, 204);
    assert_nothing_left(&cp);
    Ok(())
}

/// The package index's token, which only the gateway holds.
const SECRET: &str = "index-token-0123456789abcdef";

#[tokio::test]
async fn an_egress_kernel_pip_installs_from_an_allowed_index_and_a_denied_host_is_refused()
-> Result<()> {
    require_image(IMAGE);
    let port = free_port().to_string();
    let EgressStack { up, cp } = EgressStack::start_with(&[("E2B_PORT", &port)]).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let svc = E2bService {
        url: format!("http://127.0.0.1:{port}"),
        cp,
    };
    let v = drive(
        NEWEST,
        &svc,
        "pip_install",
        json!({
            "host": "api.upstream.test",
            "index": "https://api.upstream.test/simple/",
            "denied": "https://denied.upstream.test/",
            "secret": SECRET,
        }),
    )
    .await?;
    let install = v["install"].as_str().unwrap_or_default();
    assert!(
        install.starts_with("0\n") && install.contains("Successfully installed daivpkg-1.0"),
        "{v}"
    );
    assert_eq!(v["imported"], "42", "{v}");
    // The gateway's refusal (a 403 to the tunnel) reached the kernel.
    let denied = v["denied"].as_str().unwrap_or_default();
    assert!(
        denied.starts_with("refused") && denied.contains("403"),
        "{v}"
    );
    // The index saw the token the gateway added; the kernel never had it.
    let seen = up.requests()?;
    let wheel = seen
        .iter()
        .find(|r| r["path"] == "/packages/daivpkg-1.0-py3-none-any.whl")
        .with_context(|| format!("the wheel was never fetched: {seen:?}"))?;
    assert_eq!(wheel["headers"]["x-index-token"], SECRET, "{wheel}");
    assert_eq!(v["kernel_env_has_secret"], "False", "{v}");
    assert!(!svc.cp.logs().contains(SECRET), "the secret is in the log");
    assert_nothing_left(&svc.cp);
    Ok(())
}

#[tokio::test]
async fn the_e2b_door_runs_code_only_with_the_sandboxs_access_token() -> Result<()> {
    let svc = service(&[]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let http = reqwest::Client::new();
    let created: Value = http
        .post(format!("{}/sandboxes", svc.url))
        .header("X-API-KEY", &svc.cp.key)
        .json(&json!({"templateID": "code-interpreter-v1", "timeout": 300}))
        .send()
        .await?
        .json()
        .await?;
    let id = created["sandboxID"].as_str().context("sandboxID")?;
    let token = created["envdAccessToken"].as_str().context("token")?;
    let execute = |token: Option<&str>| {
        let mut req = http
            .post(format!("{}/execute", svc.url))
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", "49999")
            .json(&json!({"code": "1+1"}));
        if let Some(t) = token {
            req = req.header("X-Access-Token", t);
        }
        req.send()
    };
    // Without the token, or with another sandbox's, nothing runs.
    let r = execute(None).await?;
    assert_eq!(r.status(), 401);
    let r = execute(Some(&"0".repeat(token.len()))).await?;
    assert_eq!(r.status(), 401);
    // With it, the cell runs; contexts take no token (they run nothing), as E2B's SDK sends none.
    let r = execute(Some(token)).await?;
    assert_eq!(r.status(), 200);
    let body = r.text().await?;
    assert!(body.contains("\"text\":\"2\""), "{body}");
    let r = http
        .get(format!("{}/contexts", svc.url))
        .header("E2b-Sandbox-Id", id)
        .header("E2b-Sandbox-Port", "49999")
        .send()
        .await?;
    assert_eq!(r.status(), 200);
    let r = http
        .delete(format!("{}/sandboxes/{id}", svc.url))
        .header("X-API-KEY", &svc.cp.key)
        .send()
        .await?;
    assert_eq!(r.status(), 204);
    assert_nothing_left(&svc.cp);
    Ok(())
}
