//! `/docs` in a real browser: Debian's chromium, headless, driven over the DevTools protocol
//! (chromiumoxide), against the real service on real Docker. What an operator does with the page:
//! open it, read the operations, call health, authorise with the key, create a session and seed
//! it with an archive chosen as a file.
//!
//! The browser is fenced to this machine: names resolve nowhere but loopback and every other
//! address goes through a proxy that does not exist, so even a page that tried could not reach
//! out. The test still proves it does not try: every request the page makes is recorded and
//! must go to the service's origin, and the page's Content-Security-Policy must report nothing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use chromiumoxide::Page;
use chromiumoxide::browser::{Browser, BrowserConfig};
use chromiumoxide::cdp::browser_protocol::dom::SetFileInputFilesParams;
use chromiumoxide::cdp::browser_protocol::network::EventRequestWillBeSent;
use e2e::workspace::{Member, gzip, tar_of};
use e2e::{BUSYBOX, ControlPlane, Session, eventually, require_image};
use futures::StreamExt;
use reqwest::Method;
use serde_json::Value;

/// How long the page may take for one step (first load parses a 1.5 MB bundle on a busy machine).
const STEP: Duration = Duration::from_secs(60);

#[tokio::test]
async fn docs_page_lists_every_operation_and_calls_the_api_from_the_browser() -> Result<()> {
    let chromium = Chromium::launch().await?;
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let page = &chromium.page;

    // Every request the page makes, from the first one.
    let requests = Arc::new(Mutex::new(Vec::<String>::new()));
    let mut sent = page.event_listener::<EventRequestWillBeSent>().await?;
    let seen = requests.clone();
    let recorder = tokio::spawn(async move {
        while let Some(event) = sent.next().await {
            if let Ok(mut seen) = seen.lock() {
                seen.push(event.request.url.clone());
            }
        }
    });
    // What the Content-Security-Policy blocked, as the page itself sees it.
    page.evaluate_on_new_document(
        "window.__cspViolations = []; document.addEventListener('securitypolicyviolation', \
         e => window.__cspViolations.push(e.violatedDirective + ' ' + e.blockedURI));",
    )
    .await?;

    page.goto(cp.url("/docs")).await?;

    // Every operation of the document is listed.
    let (_, doc) = cp.call(Method::GET, "/openapi.json", None).await?;
    let documented = operations(&doc);
    let listed = eventually("Swagger UI lists the operations", STEP, || async {
        let n = count(page, ".opblock").await?;
        Ok((n >= documented.len()).then_some(n))
    })
    .await?;
    assert_eq!(listed, documented.len(), "operations listed vs documented");
    for (tag, id) in &documented {
        let block = format!("#operations-{tag}-{id}");
        assert_eq!(count(page, &block).await?, 1, "{block} is not listed");
    }

    // Health, with no key: expand, "Try it out", "Execute".
    let health = "#operations-meta-health";
    try_it_out(page, health).await?;
    let (status, _) = execute(page, health).await?;
    assert_eq!(status, 200, "GET /-/health/ from the page");

    // Authorise with the key, as an operator does.
    click(page, ".auth-wrapper .btn.authorize").await?;
    page.find_element("#api_key_value")
        .await
        .context("the Authorize dialog has no API key field")?
        .click()
        .await?
        .type_str(&cp.key)
        .await?;
    click(page, ".auth-btn-wrapper .btn.modal-btn.auth.authorize").await?;
    eventually("the key is accepted", STEP, || async {
        Ok(text(page, ".auth-container h6")
            .await?
            .contains("Authorized")
            .then_some(()))
    })
    .await?;
    click(page, ".auth-btn-wrapper .btn-done").await?;

    // Create a session: the body names the local image.
    let create = "#operations-session-create";
    try_it_out(page, create).await?;
    let body = page
        .find_element(format!("{create} textarea.body-param__text"))
        .await
        .context("POST /session/ has no body editor")?;
    body.click().await?;
    body.call_js_fn("function () { this.select(); }", false)
        .await?;
    body.type_str(format!(r#"{{"base_image": "{BUSYBOX}"}}"#))
        .await?;
    let (status, answer) = execute(page, create).await?;
    let id = session_id(&answer).with_context(|| format!("no session id in {answer:?}"))?;
    // Removed with its volumes on drop, whatever happens below.
    let session = Session { id: id.clone() };
    assert_eq!(status, 200, "POST /session/ from the page: {answer}");
    let (status, _) = cp
        .call(Method::GET, &format!("/session/{id}/"), None)
        .await?;
    assert_eq!(status, 204, "the session the page created exists");

    // Seed it from the page: an archive chosen for `repo_archive` (the multipart form has a file
    // input per archive), the session id typed in.
    let seed = "#operations-session-seed";
    try_it_out(page, seed).await?;
    let file_input =
        |field: &str| format!("{seed} tr[data-property-name='{field}'] input[type='file']");
    for field in ["repo_archive", "skills_archive"] {
        assert_eq!(
            count(page, &file_input(field)).await?,
            1,
            "no file input for {field}"
        );
    }
    let archive = chromium.profile.with_extension("repo.tar.gz");
    let readme = "seeded from the docs page\n";
    std::fs::write(
        &archive,
        gzip(&tar_of(&[Member::File(
            "README.md",
            readme.as_bytes(),
            0o644,
        )])?)?,
    )?;
    let input = page.find_element(file_input("repo_archive")).await?;
    let chosen = SetFileInputFilesParams::builder()
        .file(archive.display().to_string())
        .backend_node_id(input.backend_node_id)
        .build()
        .map_err(anyhow::Error::msg)?;
    page.execute(chosen).await?;
    page.find_element(format!("{seed} tr[data-param-name='session_id'] input"))
        .await
        .context("the seed has no session_id field")?
        .click()
        .await?
        .type_str(&id)
        .await?;
    let (status, answer) = execute(page, seed).await?;
    let _ = std::fs::remove_file(&archive);
    assert_eq!(status, 204, "seed from the page: {answer}");
    assert_eq!(
        cp.sh(&session, "cat README.md").await?,
        (0, readme.to_string())
    );

    // A run's media type picks its `Accept` header: JSON, or NDJSON for a streamed run.
    let run = "#operations-session-run";
    expand(page, run).await?;
    let media_types = eval_string(
        page,
        &format!(
            "[...document.querySelectorAll(\"{run} .response-control-media-type--accept-controller \
             select option\")].map(o => o.value).join(' ')"
        ),
    )
    .await?;
    assert!(
        media_types.contains("application/json") && media_types.contains("application/x-ndjson"),
        "run's response media types: {media_types:?}"
    );

    let violations = page
        .evaluate("JSON.stringify(window.__cspViolations)")
        .await?
        .into_value::<String>()?;
    assert_eq!(violations, "[]", "Content-Security-Policy violations");
    recorder.abort();
    let requests = requests.lock().map(|r| r.clone()).unwrap_or_default();
    let origin = format!("{}/", cp.base);
    // `data:` images (the stylesheet's icons) are decoded in place, not fetched.
    let external: Vec<&String> = requests
        .iter()
        .filter(|u| !u.starts_with(&origin) && !u.starts_with("data:"))
        .collect();
    assert!(
        external.is_empty(),
        "requests off the service: {external:?}"
    );
    for expected in ["/api/v1/docs/swagger-ui-bundle.js", "/api/v1/openapi.json"] {
        assert!(
            requests.iter().any(|u| u.ends_with(expected)),
            "{expected} not requested: {requests:?}"
        );
    }
    for call in ["-/health/", "session/", &format!("session/{id}/seed/")] {
        let called = format!("{}/api/v1/{call}", cp.base);
        assert!(
            requests.contains(&called),
            "{called} not requested: {requests:?}"
        );
    }

    assert_eq!(cp.force_close(&session).await?, 204);
    chromium.close().await;
    Ok(())
}

/// `(tag, operationId)` of every operation in the document: Swagger UI's block ids.
fn operations(doc: &Value) -> Vec<(String, String)> {
    let mut ops = Vec::new();
    for item in doc["paths"]
        .as_object()
        .into_iter()
        .flat_map(|p| p.values())
    {
        for method in ["get", "put", "post", "delete", "patch"] {
            let op = &item[method];
            if let (Some(tag), Some(id)) = (op["tags"][0].as_str(), op["operationId"].as_str()) {
                ops.push((tag.to_string(), id.to_string()));
            }
        }
    }
    ops
}

/// The 64-hex-digit session id in a rendered response body.
fn session_id(answer: &str) -> Option<String> {
    let start = answer.find("\"session_id\"")?;
    let rest = &answer[start + "\"session_id\"".len()..];
    let id: String = rest
        .chars()
        .skip_while(|c| !c.is_ascii_hexdigit())
        .take_while(char::is_ascii_hexdigit)
        .collect();
    (id.len() == 64).then_some(id)
}

/// Opens an operation's block (a no-op when it is open).
async fn expand(page: &Page, op: &str) -> Result<()> {
    let open = count(page, &format!("{op}.is-open")).await? == 1;
    if !open {
        click(page, &format!("{op} .opblock-summary-control")).await?;
    }
    eventually(&format!("{op} opens"), STEP, || async {
        Ok((count(page, &format!("{op}.is-open")).await? == 1).then_some(()))
    })
    .await
}

async fn try_it_out(page: &Page, op: &str) -> Result<()> {
    expand(page, op).await?;
    click(page, &format!("{op} .try-out__btn")).await?;
    eventually(&format!("{op}: Execute appears"), STEP, || async {
        Ok((count(page, &format!("{op} .btn.execute")).await? == 1).then_some(()))
    })
    .await
}

/// Clicks Execute and waits for the live response: its status and the rendered details.
async fn execute(page: &Page, op: &str) -> Result<(u16, String)> {
    click(page, &format!("{op} .btn.execute")).await?;
    let status_cell = format!("{op} .live-responses-table .response .response-col_status");
    let status = eventually(&format!("{op}: a response"), STEP, || async {
        let cell = text(page, &status_cell).await?;
        let digits: String = cell
            .trim()
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        Ok(digits.parse::<u16>().ok())
    })
    .await?;
    let details = text(
        page,
        &format!("{op} .live-responses-table .response .response-col_description"),
    )
    .await?;
    Ok((status, details))
}

/// A real mouse click on the element (scrolled into view first).
async fn click(page: &Page, selector: &str) -> Result<()> {
    let element = eventually(&format!("{selector} is on the page"), STEP, || async {
        Ok(page.find_element(selector).await.ok())
    })
    .await?;
    element.click().await?;
    Ok(())
}

async fn count(page: &Page, selector: &str) -> Result<usize> {
    let js = format!(
        "document.querySelectorAll({}).length",
        Value::from(selector)
    );
    Ok(page.evaluate(js).await?.into_value::<usize>()?)
}

/// The element's rendered text, empty when it is not there.
async fn text(page: &Page, selector: &str) -> Result<String> {
    eval_string(
        page,
        &format!(
            "(document.querySelector({}) || {{}}).innerText || ''",
            Value::from(selector)
        ),
    )
    .await
}

async fn eval_string(page: &Page, js: &str) -> Result<String> {
    Ok(page.evaluate(js).await?.into_value::<String>()?)
}

/// Headless chromium with a profile of its own, fenced to loopback.
struct Chromium {
    browser: Browser,
    handler: tokio::task::JoinHandle<()>,
    page: Page,
    profile: PathBuf,
}

impl Chromium {
    async fn launch() -> Result<Self> {
        let Some(executable) = which("chromium") else {
            bail!("chromium not found: run `scripts/ensure-chromium.sh` (make test does)");
        };
        let profile = std::env::temp_dir().join(format!(
            "daiv-docs-chromium-{}-{}",
            std::process::id(),
            e2e::free_port()
        ));
        let config = BrowserConfig::builder()
            .chrome_executable(executable)
            .new_headless_mode()
            // The tests run as root, where chromium's sandbox cannot start.
            .no_sandbox()
            .user_data_dir(&profile)
            .window_size(1280, 1600)
            .request_timeout(STEP)
            // No name resolves but loopback's, and anything not on loopback goes to a proxy
            // that is not there. chromiumoxide writes `--key=value` itself: a key given with
            // its dashes would reach chromium as `----key`, and be ignored.
            .arg((
                "host-resolver-rules",
                "MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1",
            ))
            .arg(("proxy-server", "http://127.0.0.1:9"))
            .args([
                "disable-component-update",
                "disable-domain-reliability",
                "no-pings",
                "no-default-browser-check",
            ])
            .build()
            .map_err(anyhow::Error::msg)?;
        let (browser, mut events) = Browser::launch(config)
            .await
            .context("start chromium (scripts/ensure-chromium.sh installs it)")?;
        let handler = tokio::spawn(async move { while events.next().await.is_some() {} });
        let page = browser.new_page("about:blank").await?;
        Ok(Self {
            browser,
            handler,
            page,
            profile,
        })
    }

    async fn close(mut self) {
        let _ = self.browser.close().await;
        let _ = self.browser.wait().await;
        self.handler.abort();
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

impl Drop for Chromium {
    fn drop(&mut self) {
        // After a failure: the child is killed on drop (chromiumoxide), the profile goes here.
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

fn which(program: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| PathBuf::from(dir).join(program))
        .find(|p| p.is_file())
}
