//! os-bench: what OpenSandbox's API costs over the native routes it translates into.
//!
//! ```text
//! os-bench --base http://127.0.0.1:8000 --os 127.0.0.1:8090 --key KEY \
//!          [--image daiv-sandbox-debian:local] [--n 50]
//! ```
//! The service at `--base` serves its OpenSandbox API at `--os` (`DAIV_SANDBOX_OPENSANDBOX_PORT`).
//! One sandbox, made through OpenSandbox's create; phases interleaved, each timed per request
//! (p50/p90/max):
//! 1. `native command`: `POST /session/{id}/processes/` `true` and its event stream read to `end`
//!    (what an execd command becomes);
//! 2. `execd command`: execd's `POST /command` `true` read to its last event, as the SDK's
//!    `commands.run` sends it;
//! 3. `native write 64 KiB` / `execd upload 64 KiB`: `PUT /session/{id}/files` against execd's
//!    multipart `POST /files/upload` of the same bytes.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

#[derive(clap::Parser, Debug)]
#[command(about = "OpenSandbox's API against the native routes it translates into")]
struct Args {
    /// Origin of the native API.
    #[arg(long)]
    base: String,
    /// host:port of the OpenSandbox API.
    #[arg(long)]
    os: String,
    #[arg(long, env = "DAIV_SANDBOX_API_KEY", hide_env_values = true)]
    key: String,
    #[arg(long, default_value = "daiv-sandbox-debian:local")]
    image: String,
    #[arg(long, default_value_t = 50)]
    n: usize,
}

struct Bench {
    http: reqwest::Client,
    base: String,
    os: String,
    key: String,
}

/// A sandbox's execd: its URL and token.
struct Execd {
    url: String,
    token: String,
}

const BODY: usize = 64 * 1024;

impl Bench {
    async fn create(&self, image: &str) -> Result<(String, Execd)> {
        let r = self
            .http
            .post(format!("http://{}/v1/sandboxes", self.os))
            .header("OPEN-SANDBOX-API-KEY", &self.key)
            .json(&json!({"image": {"uri": image}, "timeout": 3600, "entrypoint": ["tail", "-f", "/dev/null"]}))
            .send()
            .await?;
        if r.status() != 202 {
            bail!("create: {} {}", r.status(), r.text().await?);
        }
        let v: Value = r.json().await?;
        let id = v["id"].as_str().context("id")?.to_string();
        let e: Value = self
            .http
            .get(format!(
                "http://{}/v1/sandboxes/{id}/endpoints/44772",
                self.os
            ))
            .header("OPEN-SANDBOX-API-KEY", &self.key)
            .send()
            .await?
            .json()
            .await?;
        let execd = Execd {
            url: format!("http://{}", e["endpoint"].as_str().context("endpoint")?),
            token: e["headers"]["X-EXECD-ACCESS-TOKEN"]
                .as_str()
                .context("token")?
                .to_string(),
        };
        Ok((id, execd))
    }

    async fn native_command(&self, id: &str) -> Result<Duration> {
        let t = Instant::now();
        let v: Value = self
            .http
            .post(format!("{}/api/v1/session/{id}/processes/", self.base))
            .header("X-API-Key", &self.key)
            .json(&json!({ "command": "true" }))
            .send()
            .await?
            .json()
            .await?;
        let pid = v["process_id"].as_str().context("process_id")?;
        let text = self
            .http
            .get(format!(
                "{}/api/v1/session/{id}/processes/{pid}/events?follow=true",
                self.base
            ))
            .header("X-API-Key", &self.key)
            .send()
            .await?
            .text()
            .await?;
        let took = t.elapsed();
        if !text.contains("\"end\"") {
            bail!("no end event: {text}");
        }
        Ok(took)
    }

    async fn execd_command(&self, x: &Execd) -> Result<Duration> {
        let t = Instant::now();
        let text = self
            .http
            .post(format!("{}/command", x.url))
            .header("X-EXECD-ACCESS-TOKEN", &x.token)
            .header("Accept", "text/event-stream")
            .json(&json!({ "command": "true" }))
            .send()
            .await?
            .text()
            .await?;
        let took = t.elapsed();
        if !text.contains("execution_complete") {
            bail!("no execution_complete: {text}");
        }
        Ok(took)
    }

    async fn native_write(&self, id: &str, bytes: &[u8]) -> Result<Duration> {
        let t = Instant::now();
        let r = self
            .http
            .put(format!(
                "{}/api/v1/session/{id}/files?path=/workspace/os-bench",
                self.base
            ))
            .header("X-API-Key", &self.key)
            .body(bytes.to_vec())
            .send()
            .await?;
        let took = t.elapsed();
        if !r.status().is_success() {
            bail!("write: {} {}", r.status(), r.text().await?);
        }
        Ok(took)
    }

    async fn execd_upload(&self, x: &Execd, bytes: &[u8]) -> Result<Duration> {
        let form = reqwest::multipart::Form::new()
            .part(
                "metadata",
                reqwest::multipart::Part::text(
                    json!({"path": "/workspace/os-bench", "owner": null, "group": null, "mode": 644})
                        .to_string(),
                )
                .file_name("metadata")
                .mime_str("application/json")?,
            )
            .part(
                "file",
                reqwest::multipart::Part::bytes(bytes.to_vec()).file_name("os-bench"),
            );
        let t = Instant::now();
        let r = self
            .http
            .post(format!("{}/files/upload", x.url))
            .header("X-EXECD-ACCESS-TOKEN", &x.token)
            .multipart(form)
            .send()
            .await?;
        let took = t.elapsed();
        if !r.status().is_success() {
            bail!("upload: {} {}", r.status(), r.text().await?);
        }
        Ok(took)
    }

    async fn remove(&self, id: &str) {
        let _ = self
            .http
            .delete(format!("http://{}/v1/sandboxes/{id}", self.os))
            .header("OPEN-SANDBOX-API-KEY", &self.key)
            .send()
            .await;
    }
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let b = Bench {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()?,
        base: a.base.trim_end_matches('/').to_string(),
        os: a
            .os
            .trim_start_matches("http://")
            .trim_end_matches('/')
            .to_string(),
        key: a.key.clone(),
    };
    let (id, x) = b.create(&a.image).await?;
    let bytes: Vec<u8> = (0..BODY).map(|i| (i * 7 % 251) as u8).collect();
    // Warm both paths once.
    b.native_command(&id).await?;
    b.execd_command(&x).await?;
    let mut phases: Vec<(&str, Vec<Duration>)> = vec![
        ("native command", Vec::new()),
        ("execd command", Vec::new()),
        ("native write 64 KiB", Vec::new()),
        ("execd upload 64 KiB", Vec::new()),
    ];
    // Interleaved, so drift weighs on every phase alike.
    let run = async {
        for _ in 0..a.n {
            phases[0].1.push(b.native_command(&id).await?);
            phases[1].1.push(b.execd_command(&x).await?);
            phases[2].1.push(b.native_write(&id, &bytes).await?);
            phases[3].1.push(b.execd_upload(&x, &bytes).await?);
        }
        anyhow::Ok(())
    };
    let ran = run.await;
    b.remove(&id).await;
    ran?;
    integration::report::print_phases(&mut phases);
    Ok(())
}
