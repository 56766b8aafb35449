//! e2b-bench: what E2B's API costs over the native routes it translates into, in one run.
//!
//! ```text
//! e2b-bench --base http://127.0.0.1:8000 --e2b http://127.0.0.1:49983 --key KEY \
//!           [--template base] [--image daiv-sandbox-debian:local] [--n 50] [--pool-size 0]
//! ```
//! The service at `--base` serves its E2B API at `--e2b` (`DAIV_SANDBOX_E2B_PORT`), with the
//! template named `--template` on `--image`. Phases, each timed per request (p50/p90/max):
//! 1. `native command`: `POST /session/{id}/processes/` `true` and its event stream read to `end`
//!    (what an envd `Start` becomes);
//! 2. `envd command`: envd's `process.Process/Start` of `/bin/bash -l -c true` read to its end,
//!    on the same session; the difference with 1 is the translation (and `bash -l`, which 1 runs
//!    as `true` alone: 3 measures it);
//! 3. `native bash -l`: phase 1 with the command envd runs (`/bin/bash -l -c true`);
//! 4. `native run`: `POST /session/{id}/` `true` (the reference's route, for scale);
//! 5. `native read 4 MiB` / `envd read 4 MiB`: `GET /session/{id}/files` against envd's
//!    `GET /files` of the same 4 MiB file; `native write 4 MiB` / `envd write 4 MiB`: `PUT` against
//!    envd's `POST /files` (octet-stream, as the SDK's `files.write` of bytes sends it);
//! 6. with `--pool-size N` (the service has `DAIV_SANDBOX_WARM_POOL=IMAGE=N`): `native create` and
//!    `e2b create` (`POST /v2/sandboxes`), each waiting for the pool to be full first, so every
//!    create is a claim.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use futures::StreamExt;
use serde_json::{Value, json};

#[derive(clap::Parser, Debug)]
#[command(about = "E2B's API against the native routes it translates into")]
struct Args {
    /// Origin of the native API.
    #[arg(long)]
    base: String,
    /// Origin of the E2B API.
    #[arg(long)]
    e2b: String,
    #[arg(long, env = "DAIV_SANDBOX_API_KEY", hide_env_values = true)]
    key: String,
    #[arg(long, default_value = "base")]
    template: String,
    #[arg(long, default_value = "daiv-sandbox-debian:local")]
    image: String,
    #[arg(long, default_value_t = 50)]
    n: usize,
    /// The service's warm pool for `--image` (0: no create phases).
    #[arg(long, default_value_t = 0)]
    pool_size: u64,
}

struct Bench {
    http: reqwest::Client,
    base: String,
    e2b: String,
    key: String,
}

fn envelope(json: &Value) -> Vec<u8> {
    let body = json.to_string().into_bytes();
    let mut out = vec![0u8];
    out.extend_from_slice(&(body.len() as u32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

impl Bench {
    async fn native_command(&self, id: &str, command: &str) -> Result<Duration> {
        let t = Instant::now();
        let r = self
            .http
            .post(format!("{}/api/v1/session/{id}/processes/", self.base))
            .header("X-API-Key", &self.key)
            .json(&json!({ "command": command }))
            .send()
            .await?;
        let v: Value = r.json().await?;
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

    async fn envd_command(&self, id: &str, token: &str) -> Result<Duration> {
        let t = Instant::now();
        let body = envelope(&json!({
            "process": {"cmd": "/bin/bash", "args": ["-l", "-c", "true"]},
            "stdin": false,
        }));
        let r = self
            .http
            .post(format!("{}/process.Process/Start", self.e2b))
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", "49983")
            .header("X-Access-Token", token)
            .header("Content-Type", "application/connect+json")
            .header("Connect-Protocol-Version", "1")
            .body(body)
            .send()
            .await?;
        let mut stream = r.bytes_stream();
        let mut all = Vec::new();
        while let Some(chunk) = stream.next().await {
            all.extend_from_slice(&chunk?);
        }
        let took = t.elapsed();
        let text = String::from_utf8_lossy(&all);
        if !text.contains("\"end\"") {
            bail!("no end event: {text}");
        }
        Ok(took)
    }

    /// `GET` of `path`, natively or through envd (with `token`), its bytes counted.
    async fn read(&self, id: &str, path: &str, envd: Option<&str>) -> Result<Duration> {
        let t = Instant::now();
        let req = match envd {
            None => self
                .http
                .get(format!("{}/api/v1/session/{id}/files", self.base))
                .header("X-API-Key", &self.key),
            Some(token) => self
                .http
                .get(format!("{}/files", self.e2b))
                .header("E2b-Sandbox-Id", id)
                .header("E2b-Sandbox-Port", "49983")
                .header("X-Access-Token", token),
        };
        let r = req.query(&[("path", path)]).send().await?;
        let status = r.status();
        let got = r.bytes().await?.len();
        let took = t.elapsed();
        if !status.is_success() || got != FILE.len() {
            bail!("read: {status}, {got} bytes");
        }
        Ok(took)
    }

    /// `PUT` (natively) or envd's `POST /files` of [`FILE`] at `path`.
    async fn write(&self, id: &str, path: &str, envd: Option<&str>) -> Result<Duration> {
        let t = Instant::now();
        let req = match envd {
            None => self
                .http
                .put(format!("{}/api/v1/session/{id}/files", self.base))
                .header("X-API-Key", &self.key),
            Some(token) => self
                .http
                .post(format!("{}/files", self.e2b))
                .header("E2b-Sandbox-Id", id)
                .header("E2b-Sandbox-Port", "49983")
                .header("X-Access-Token", token),
        };
        let r = req
            .query(&[("path", path)])
            .header("Content-Type", "application/octet-stream")
            .body(FILE.clone())
            .send()
            .await?;
        let status = r.status();
        let _ = r.bytes().await?;
        if !status.is_success() {
            bail!("write: {status}");
        }
        Ok(t.elapsed())
    }

    async fn native_run(&self, id: &str) -> Result<Duration> {
        let t = Instant::now();
        let r = self
            .http
            .post(format!("{}/api/v1/session/{id}/", self.base))
            .header("X-API-Key", &self.key)
            .json(&json!({ "commands": ["true"] }))
            .send()
            .await?;
        let status = r.status();
        let _ = r.bytes().await?;
        if !status.is_success() {
            bail!("run: {status}");
        }
        Ok(t.elapsed())
    }

    async fn e2b_create(&self, template: &str) -> Result<(String, String, Duration)> {
        let t = Instant::now();
        let r = self
            .http
            .post(format!("{}/v2/sandboxes", self.e2b))
            .header("X-API-KEY", &self.key)
            .json(&json!({ "templateID": template, "timeout": 600 }))
            .send()
            .await?;
        let status = r.status();
        let v: Value = r.json().await?;
        let took = t.elapsed();
        if status.as_u16() != 201 {
            bail!("create: {status} {v}");
        }
        Ok((
            v["sandboxID"].as_str().context("sandboxID")?.to_string(),
            v["envdAccessToken"].as_str().context("token")?.to_string(),
            took,
        ))
    }

    async fn native_create(&self, image: &str) -> Result<(String, Duration)> {
        let t = Instant::now();
        let r = self
            .http
            .post(format!("{}/api/v1/session/", self.base))
            .header("X-API-Key", &self.key)
            .json(&json!({ "base_image": image }))
            .send()
            .await?;
        let status = r.status();
        let v: Value = r.json().await?;
        let took = t.elapsed();
        if !status.is_success() {
            bail!("create: {status} {v}");
        }
        Ok((v["session_id"].as_str().context("id")?.to_string(), took))
    }

    async fn remove(&self, id: &str) {
        let _ = self
            .http
            .delete(format!("{}/api/v1/session/{id}/?force=true", self.base))
            .header("X-API-Key", &self.key)
            .send()
            .await;
    }

    async fn pool_size(&self, image: &str) -> Result<f64> {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .header("X-API-Key", &self.key)
            .send()
            .await?
            .text()
            .await?;
        let filter = format!("image=\"{image}\",kind=\"isolated\"");
        Ok(text
            .lines()
            .filter(|l| l.starts_with("daiv_sandbox_pool_size{") && l.contains(&filter))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }

    async fn pool_full(&self, image: &str, size: u64) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(180);
        while (self.pool_size(image).await? as u64) < size {
            if Instant::now() > deadline {
                bail!("the pool did not refill to {size}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(())
    }
}

/// The file the read and write phases move: 4 MiB that do not compress to nothing.
static FILE: std::sync::LazyLock<bytes::Bytes> = std::sync::LazyLock::new(|| {
    let mut x = 0x9E37_79B9_7F4A_7C15u64;
    (0..4 << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect::<Vec<u8>>()
        .into()
});

#[tokio::main]
async fn main() -> Result<()> {
    let a = <Args as clap::Parser>::parse();
    let b = Bench {
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(120))
            .build()?,
        base: a.base.trim_end_matches('/').to_string(),
        e2b: a.e2b.trim_end_matches('/').to_string(),
        key: a.key.clone(),
    };
    let (id, token, _) = b.e2b_create(&a.template).await?;
    // Warm both paths once.
    b.native_command(&id, "true").await?;
    b.envd_command(&id, &token).await?;
    let mut phases: Vec<(&str, Vec<Duration>)> = vec![
        ("native command", Vec::new()),
        ("envd command", Vec::new()),
        ("native bash -l", Vec::new()),
        ("native run", Vec::new()),
        ("native read 4 MiB", Vec::new()),
        ("envd read 4 MiB", Vec::new()),
        ("native write 4 MiB", Vec::new()),
        ("envd write 4 MiB", Vec::new()),
    ];
    const FILE_PATH: &str = "/tmp/e2b-bench-4m";
    b.write(&id, FILE_PATH, None).await?;
    // Interleaved, so drift (dying cgroups, a busy engine) weighs on every phase alike.
    for _ in 0..a.n {
        phases[0].1.push(b.native_command(&id, "true").await?);
        phases[1].1.push(b.envd_command(&id, &token).await?);
        phases[2]
            .1
            .push(b.native_command(&id, "/bin/bash -l -c true").await?);
        phases[3].1.push(b.native_run(&id).await?);
        phases[4].1.push(b.read(&id, FILE_PATH, None).await?);
        phases[5]
            .1
            .push(b.read(&id, FILE_PATH, Some(&token)).await?);
        phases[6].1.push(b.write(&id, FILE_PATH, None).await?);
        phases[7]
            .1
            .push(b.write(&id, FILE_PATH, Some(&token)).await?);
    }
    b.remove(&id).await;
    if a.pool_size > 0 {
        let (mut native, mut e2b) = (Vec::new(), Vec::new());
        for _ in 0..a.n.min(20) {
            b.pool_full(&a.image, a.pool_size).await?;
            let (nid, t) = b.native_create(&a.image).await?;
            native.push(t);
            b.remove(&nid).await;
            b.pool_full(&a.image, a.pool_size).await?;
            let (eid, _, t) = b.e2b_create(&a.template).await?;
            e2b.push(t);
            b.remove(&eid).await;
        }
        phases.push(("native create (claim)", native));
        phases.push(("e2b create (claim)", e2b));
    }
    integration::report::print_phases(&mut phases);
    Ok(())
}
