//! Ingress on real Docker: a web server started in a sandbox (Debian's python3, listening on the
//! sandbox's own loopback) reached through the service by its path route, its preview host and
//! a port token; under runc, and under gVisor with egress on. No port is published on the host:
//! nothing on the host listens on the sandbox's port (`ss -ltn`), the session's container
//! publishes no port and stays on no network (runc) or its own egress network.

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use e2e::egress::EgressStack;
use e2e::{ControlPlane, DEBIAN, Session, eventually, require_image};
use reqwest::Method;
use serde_json::{Value, json};

const DOMAIN: &str = "preview.test";
const PORT: u16 = 8765;

/// The host's listening TCP sockets (`ss -ltn`'s local addresses). Other tests open and close
/// theirs meanwhile, so a test looks for its own port only.
fn host_listeners() -> Result<Vec<String>> {
    let out = std::process::Command::new("ss").args(["-ltnH"]).output()?;
    ensure!(out.status.success(), "ss failed");
    Ok(String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.split_whitespace().nth(3).map(str::to_string))
        .collect())
}

/// Nothing of session `id` is reachable from the host but through the service: no host socket
/// listens on the sandbox's port, its container publishes nothing and has no network of its own
/// (runc without egress) or only its egress network.
fn nothing_published(id: &str, egress: bool) -> Result<()> {
    let listening = host_listeners()?;
    ensure!(
        !listening.iter().any(|a| a.ends_with(&format!(":{PORT}"))),
        "the host listens on the sandbox's port: {listening:?}"
    );
    let info = e2e::inspect(id).context("the session's container")?;
    let bindings = &info["HostConfig"]["PortBindings"];
    ensure!(
        bindings.is_null() || bindings.as_object().is_some_and(|m| m.is_empty()),
        "{bindings}"
    );
    let ports = &info["NetworkSettings"]["Ports"];
    ensure!(
        ports.is_null()
            || ports
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_null)),
        "{ports}"
    );
    let mode = info["HostConfig"]["NetworkMode"].as_str().unwrap_or("");
    if egress {
        ensure!(
            mode != "host" && mode != "bridge" && mode != "default",
            "{mode}"
        );
    } else {
        ensure!(mode == "none", "{mode}");
    }
    Ok(())
}

/// Writes the site `files` makes (a shell command) and starts python3's web server on the
/// sandbox's loopback, serving `dir`.
async fn serve_site(cp: &ControlPlane, s: &Session, files: &str, dir: &str) -> Result<()> {
    let (code, out) = cp.sh(s, files).await?;
    ensure!(code == 0, "{out}");
    let (status, v) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({
                "command": format!("python3 -m http.server {PORT} --bind 127.0.0.1 --directory {dir}"),
            })),
        )
        .await?;
    ensure!(status == 201, "start: {status} {v}");
    Ok(())
}

/// A page with a root-relative link served from the sandbox's loopback, once it answers through
/// the service.
async fn start_server(cp: &ControlPlane, s: &Session) -> Result<()> {
    serve_site(
        cp,
        s,
        "mkdir -p /tmp/site/assets && printf '<a href=\"/assets/x.txt\">x</a>' > /tmp/site/index.html \
         && printf 'asset-bytes' > /tmp/site/assets/x.txt",
        "/tmp/site",
    )
    .await?;
    eventually("the server answers", Duration::from_secs(30), || async {
        let r = cp
            .request(Method::GET, &format!("/session/{}/ports/{PORT}/", s.id))
            .send()
            .await?;
        Ok((r.status() == 200).then_some(()))
    })
    .await
}

async fn fetch_everything(cp: &ControlPlane, s: &Session) -> Result<()> {
    // The path route with the key.
    let r = cp
        .request(Method::GET, &format!("/session/{}/ports/{PORT}/", s.id))
        .send()
        .await?;
    ensure!(r.status() == 200);
    ensure!(r.text().await?.contains("/assets/x.txt"));
    // The preview host with a token: the page's root-relative link works there.
    let (status, v) = cp
        .call(
            Method::POST,
            &format!("/session/{}/ports/{PORT}/token", s.id),
            Some(json!({"ttl_seconds": 300})),
        )
        .await?;
    ensure!(status == 200, "{v}");
    let token = v["token"].as_str().context("token")?;
    let url = v["url"].as_str().context("url")?;
    let host = url
        .trim_start_matches("https://")
        .trim_end_matches('/')
        .to_string();
    ensure!(host.ends_with(DOMAIN), "{url}");
    let r = cp
        .http()
        .get(cp.url("/assets/x.txt").replace("/api/v1", ""))
        .header("host", &host)
        .header("x-daiv-port-token", token)
        .send()
        .await?;
    ensure!(r.status() == 200, "{}", r.status());
    ensure!(r.text().await? == "asset-bytes");
    // No credential: refused; a closed port: 502 port_closed; a system port: 422.
    let r = cp
        .http()
        .get(cp.url(&format!("/session/{}/ports/{PORT}/", s.id)))
        .send()
        .await?;
    ensure!(r.status() == 403, "{}", r.status());
    let r = cp
        .request(
            Method::GET,
            &format!("/session/{}/ports/{}/", s.id, PORT + 1),
        )
        .send()
        .await?;
    ensure!(r.status() == 502, "{}", r.status());
    let v: Value = r.json().await?;
    ensure!(v["code"] == "port_closed", "{v}");
    let r = cp
        .request(Method::GET, &format!("/session/{}/ports/22/", s.id))
        .send()
        .await?;
    ensure!(r.status() == 422, "{}", r.status());
    Ok(())
}

#[tokio::test]
async fn a_web_app_in_a_sandbox_is_reached_by_path_host_and_token_and_no_port_is_published()
-> Result<()> {
    require_image(DEBIAN);
    let cp = ControlPlane::start_with(&[("PREVIEW_DOMAIN", DOMAIN)]).await?;
    let s = cp.session_of(DEBIAN).await?;
    start_server(&cp, &s).await?;
    fetch_everything(&cp, &s).await?;
    nothing_published(&s.id, false)?;
    // Wake on traffic, right after a connection (the session is trusted to run then, and its
    // frozen helper must not hang the request): pause, and the next request thaws it.
    let (status, v) = cp
        .call(Method::POST, &format!("/session/{}/pause/", s.id), None)
        .await?;
    ensure!(status == 204, "{status} {v}");
    let r = cp
        .request(Method::GET, &format!("/session/{}/ports/{PORT}/", s.id))
        .send()
        .await?;
    ensure!(r.status() == 200, "after a pause: {}", r.status());
    let (_, v) = cp
        .call(Method::GET, &format!("/session/{}/info/", s.id), None)
        .await?;
    ensure!(v["state"] == "running", "{v}");
    // The connections were counted and all closed.
    let (status, v) = cp
        .call(Method::GET, &format!("/session/{}/ports", s.id), None)
        .await?;
    ensure!(status == 200, "{v}");
    ensure!(v["opened"].as_u64().unwrap_or(0) >= 3, "{v}");
    let metrics = cp.metrics().await?;
    ensure!(
        metrics.contains("daiv_sandbox_port_streams_opened_total"),
        "no port metrics"
    );
    Ok(())
}

#[tokio::test]
async fn a_web_app_under_gvisor_with_egress_on_is_reached_the_same_way() -> Result<()> {
    require_image(DEBIAN);
    let stack =
        EgressStack::start_with(&[("RUNTIME", "runsc"), ("PREVIEW_DOMAIN", DOMAIN)]).await?;
    let cp = &stack.cp;
    let policy = json!({
        "policy": {"default": "deny", "rules": [{"host": "api.upstream.test", "methods": ["GET"]}]},
        "secrets": {}
    });
    let s = cp
        .session(json!({"base_image": DEBIAN, "egress": policy}))
        .await?;
    start_server(cp, &s).await?;
    fetch_everything(cp, &s).await?;
    nothing_published(&s.id, true)?;
    Ok(())
}

/// A browser (headless Chromium) opens a preview host's link with its token, is given the
/// cookie and redirected, and the page's root-relative script loads from the same host: the
/// page runs as it would on its own domain. The browser's only proxy is the service: no name is
/// resolved, nothing else is reached.
#[tokio::test]
async fn a_browser_loads_a_page_with_root_relative_links_on_a_preview_host() -> Result<()> {
    use chromiumoxide::browser::{Browser, BrowserConfig};
    use futures::StreamExt;

    require_image(DEBIAN);
    let Some(chromium) = std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join("chromium"))
            .find(|p| p.is_file())
    }) else {
        anyhow::bail!("chromium not found: run `scripts/ensure-chromium.sh` (make test does)");
    };
    // Plain http here: a Secure cookie would not be kept.
    let cp =
        ControlPlane::start_with(&[("PREVIEW_DOMAIN", DOMAIN), ("PREVIEW_SCHEME", "http")]).await?;
    let s = cp.session_of(DEBIAN).await?;
    serve_site(
        &cp,
        &s,
        "mkdir -p /tmp/app/static && printf '<html><head><title>loading</title>\
         <script src=\"/static/app.js\"></script></head><body>app</body></html>' \
         > /tmp/app/index.html && \
         printf 'document.title = \"root-relative-ok\";' > /tmp/app/static/app.js",
        "/tmp/app",
    )
    .await?;
    let (status, v) = cp
        .call(
            Method::POST,
            &format!("/session/{}/ports/{PORT}/token", s.id),
            Some(json!({"public": true, "ttl_seconds": 300})),
        )
        .await?;
    ensure!(status == 200, "{v}");
    let service_port = cp
        .url("/")
        .split(':')
        .nth(2)
        .and_then(|p| p.split('/').next().map(str::to_string));
    let service_port = service_port.context("the service's port")?;
    // `http://{port}-{short}.preview.test/?daiv_port_token=…` on the service's own port.
    let link = v["url"].as_str().context("url")?.replacen(
        &format!(".{DOMAIN}/"),
        &format!(".{DOMAIN}:{service_port}/"),
        1,
    );

    let profile =
        std::env::temp_dir().join(format!("daiv-ingress-chromium-{}", std::process::id()));
    let config = BrowserConfig::builder()
        .chrome_executable(chromium)
        .new_headless_mode()
        .no_sandbox()
        .user_data_dir(&profile)
        // Every request goes to the service as its proxy (no name is resolved): the preview host
        // reaches it as a wildcard DNS entry would, and nothing else exists. (chromiumoxide adds
        // the leading `--` itself: keys and values apart.)
        .arg((
            "proxy-server",
            format!("http://127.0.0.1:{service_port}").as_str(),
        ))
        .arg(("proxy-bypass-list", "<-loopback>"))
        .arg("disable-component-update")
        .arg("no-pings")
        .build()
        .map_err(anyhow::Error::msg)?;
    let (mut browser, mut events) = Browser::launch(config).await?;
    let handler = tokio::spawn(async move { while events.next().await.is_some() {} });
    let outcome = async {
        let page = browser.new_page("about:blank").await?;
        // The server needs a moment to listen: the link is opened until the page is the app's.
        let title = eventually("the page's script ran", Duration::from_secs(60), || {
            let (page, link) = (page.clone(), link.clone());
            async move {
                page.goto(link).await?;
                tokio::time::sleep(Duration::from_millis(300)).await;
                let title = page.get_title().await?.unwrap_or_default();
                Ok((title == "root-relative-ok").then_some(title))
            }
        })
        .await?;
        let url = page.url().await?.unwrap_or_default();
        ensure!(
            !url.contains("daiv_port_token"),
            "the token stayed in the address: {url}"
        );
        Ok::<_, anyhow::Error>(title)
    }
    .await;
    let _ = browser.close().await;
    let _ = browser.wait().await;
    handler.abort();
    let _ = std::fs::remove_dir_all(&profile);
    outcome?;
    Ok(())
}
