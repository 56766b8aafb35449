//! A small client of the control plane's API and the deterministic archives the drivers seed
//! with, shared by `cp-bench` (latency) and `cp-soak` (sustained mixed load).

use std::time::Duration;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

/// The service a driver talks to: its origin, its key, and the image its sessions use.
#[derive(clap::Args, Debug, Clone)]
pub struct Target {
    /// The service's origin.
    #[arg(
        long,
        env = "CP_BENCH_BASE_URL",
        default_value = "http://127.0.0.1:8000"
    )]
    pub base: String,
    /// The API key.
    #[arg(long, env = "DAIV_SANDBOX_API_KEY", hide_env_values = true)]
    pub key: String,
    /// The sessions' base image.
    #[arg(long, default_value = "daiv-sandbox-busybox:local")]
    pub image: String,
}

/// The API under `{base}/api/v1` with one key; cheap to clone (one connection pool).
#[derive(Clone)]
pub struct Client {
    pub http: reqwest::Client,
    /// `{base}/api/v1`.
    pub api: String,
    pub key: String,
}

impl Client {
    /// `base` is the service's origin (`http://127.0.0.1:8000`); requests time out after
    /// `timeout`.
    pub fn new(base: &str, key: &str, timeout: Duration) -> Result<Self> {
        Ok(Self {
            http: reqwest::Client::builder().timeout(timeout).build()?,
            api: format!("{}/api/v1", base.trim_end_matches('/')),
            key: key.to_string(),
        })
    }

    /// POST a JSON body; a non-2xx status is an error carrying the status and body.
    pub async fn post(&self, path: &str, body: Value) -> Result<Value> {
        let r = self
            .http
            .post(format!("{}{path}", self.api))
            .header("X-API-Key", &self.key)
            .json(&body)
            .send()
            .await?;
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("POST {path}: {status} {v}");
        }
        Ok(v)
    }

    /// GET a JSON answer; a non-2xx status is an error carrying the status and body.
    pub async fn get(&self, path: &str) -> Result<Value> {
        let r = self
            .http
            .get(format!("{}{path}", self.api))
            .header("X-API-Key", &self.key)
            .send()
            .await?;
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        if !status.is_success() {
            bail!("GET {path}: {status} {v}");
        }
        Ok(v)
    }

    /// DELETE `path` (any route); a non-2xx status is an error.
    pub async fn delete_path(&self, path: &str) -> Result<()> {
        let r = self
            .http
            .delete(format!("{}{path}", self.api))
            .header("X-API-Key", &self.key)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("DELETE {path}: {}", r.status());
        }
        Ok(())
    }

    /// Starts a streaming run (`Accept: application/x-ndjson`) of `commands` and reads its
    /// NDJSON lines as they arrive until the first `output` line, which it returns; the stream
    /// is dropped then (the service kills the batch when the client goes away). A stream that
    /// ends, or reports `error`/`done`, before any output is an error.
    pub async fn stream_first_output(&self, id: &str, commands: &[&str]) -> Result<Value> {
        use futures::StreamExt as _;
        let r = self
            .http
            .post(format!("{}/session/{id}/", self.api))
            .header("X-API-Key", &self.key)
            .header("Accept", "application/x-ndjson")
            .json(&json!({"commands": commands}))
            .send()
            .await?;
        let status = r.status();
        if !status.is_success() {
            bail!("stream: {status} {}", r.text().await.unwrap_or_default());
        }
        let mut body = r.bytes_stream();
        let mut buf: Vec<u8> = Vec::new();
        while let Some(chunk) = body.next().await {
            buf.extend_from_slice(&chunk?);
            while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = buf.drain(..=nl).collect();
                let v: Value = serde_json::from_slice(&line)
                    .with_context(|| format!("stream line {}", String::from_utf8_lossy(&line)))?;
                match v["type"].as_str() {
                    Some("output") => return Ok(v),
                    Some("done" | "error") => bail!("stream ended before any output: {v}"),
                    _ => {}
                }
            }
        }
        bail!("stream closed before any output")
    }

    /// `POST /session/` with `base_image` only.
    pub async fn create(&self, image: &str) -> Result<String> {
        let v = self.post("/session/", json!({"base_image": image})).await?;
        Ok(v["session_id"]
            .as_str()
            .context("no session_id")?
            .to_string())
    }

    /// `DELETE /session/{id}/`: stop, or remove with `force`.
    pub async fn delete(&self, id: &str, force: bool) -> Result<()> {
        let r = self
            .http
            .delete(format!("{}/session/{id}/?force={force}", self.api))
            .header("X-API-Key", &self.key)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("DELETE {id}: {}", r.status());
        }
        Ok(())
    }

    /// `GET /session/{id}/`: 204 when it exists (restarting it if stopped).
    pub async fn status(&self, id: &str) -> Result<()> {
        let r = self
            .http
            .get(format!("{}/session/{id}/", self.api))
            .header("X-API-Key", &self.key)
            .send()
            .await?;
        if r.status().as_u16() != 204 {
            bail!("GET {id}: {}", r.status());
        }
        Ok(())
    }

    /// Seeds `/workspace/repo` with `archive` (multipart field `repo_archive`); 204 or an error.
    pub async fn seed(&self, id: &str, archive: Vec<u8>) -> Result<()> {
        let part = reqwest::multipart::Part::bytes(archive).file_name("repo.tar");
        let form = reqwest::multipart::Form::new().part("repo_archive", part);
        let r = self
            .http
            .post(format!("{}/session/{id}/seed/", self.api))
            .header("X-API-Key", &self.key)
            .multipart(form)
            .send()
            .await?;
        if r.status().as_u16() != 204 {
            let s = r.status();
            bail!("seed: {s} {}", r.text().await.unwrap_or_default());
        }
        Ok(())
    }

    /// `POST /session/{id}/fs/{op}`; an fs-level `error` in the 200 is an error too.
    pub async fn fs(&self, id: &str, op: &str, body: Value) -> Result<Value> {
        let v = self.post(&format!("/session/{id}/fs/{op}"), body).await?;
        if !v["error"].is_null() {
            bail!("fs/{op}: {}", v["error"]);
        }
        Ok(v)
    }

    /// Runs `commands`; any non-zero exit code is an error naming the command and its output.
    pub async fn run_ok(&self, id: &str, commands: &[&str]) -> Result<Value> {
        let v = self
            .post(
                &format!("/session/{id}/"),
                json!({"commands": commands, "timeout": 60}),
            )
            .await?;
        let results = v["results"].as_array().context("no results")?;
        if results.len() != commands.len() {
            bail!("{} results for {} commands", results.len(), commands.len());
        }
        if let Some(bad) = results.iter().find(|r| r["exit_code"] != 0) {
            bail!(
                "command {} exited {}: {}",
                bad["command"],
                bad["exit_code"],
                bad["output"]
            );
        }
        Ok(v)
    }
}

impl Client {
    /// `POST /session/` with any body (`{"snapshot_id": ...}`, ...); the new session's id.
    pub async fn create_with(&self, body: Value) -> Result<String> {
        let v = self.post("/session/", body).await?;
        Ok(v["session_id"]
            .as_str()
            .context("no session_id")?
            .to_string())
    }

    /// `POST /session/{id}/snapshot/` with `body` (`{"name"?, "ttl_seconds"?}`): the 201's
    /// `{"snapshot_id", "name", "created_at", "size_bytes"}`.
    pub async fn snapshot(&self, id: &str, body: Value) -> Result<Value> {
        let v = self.post(&format!("/session/{id}/snapshot/"), body).await?;
        if !v["snapshot_id"].is_string() {
            bail!("snapshot: no snapshot_id in {v}");
        }
        Ok(v)
    }

    /// `DELETE /snapshots/{sid}/`.
    pub async fn delete_snapshot(&self, sid: &str) -> Result<()> {
        self.delete_path(&format!("/snapshots/{sid}/")).await
    }

    /// `POST /session/{id}/fork/` with `{"count": count}`: the forks' session ids.
    pub async fn fork(&self, id: &str, count: u32) -> Result<Vec<String>> {
        let v = self
            .post(&format!("/session/{id}/fork/"), json!({"count": count}))
            .await?;
        let ids: Vec<String> = v["session_ids"]
            .as_array()
            .context("no session_ids")?
            .iter()
            .filter_map(|i| i.as_str().map(str::to_string))
            .collect();
        if ids.len() != count as usize {
            bail!("fork of {count}: {} session ids", ids.len());
        }
        Ok(ids)
    }

    /// `POST /session/{id}/pause/` (204).
    pub async fn pause(&self, id: &str) -> Result<()> {
        self.post(&format!("/session/{id}/pause/"), json!({}))
            .await
            .map(drop)
    }

    /// The sum of a metric family's samples (`{origin}/metrics`) whose line contains `filter`.
    pub async fn metric(&self, name: &str, filter: &str) -> Result<f64> {
        let origin = self.api.strip_suffix("/api/v1").unwrap_or(&self.api);
        let r = self
            .http
            .get(format!("{origin}/metrics"))
            .header("X-API-Key", &self.key)
            .send()
            .await?;
        if !r.status().is_success() {
            bail!("GET /metrics: {}", r.status());
        }
        let text = r.text().await?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(filter))
            .filter(|l| l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

/// Deterministic pseudo-random bytes (xorshift): incompressible, reproducible.
pub fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut s = seed | 1;
    (0..len)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            s as u8
        })
        .collect()
}

/// A plain tar of `files` files of `size` bytes each.
pub fn blob_tar(files: usize, size: usize) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::with_capacity(files * (size + 1024)));
    for i in 0..files {
        let data = noise(i as u64 + 7, size);
        let mut h = tar::Header::new_gnu();
        h.set_size(size as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, format!("blobs/{}/{i}.bin", i % 16), &data[..])?;
    }
    Ok(b.into_inner()?)
}

/// The source tree as a plain tar (what put_archive takes).
pub fn plain_tree(files: usize) -> Result<Vec<u8>> {
    let gz = source_tree(files)?;
    let mut out = Vec::new();
    std::io::Read::read_to_end(&mut flate2::read::GzDecoder::new(&gz[..]), &mut out)?;
    Ok(out)
}

/// A source-like tree of `files` small text files in nested directories, gzipped: file `i` is
/// `pkg{i%20}/sub{i%7}/mod_{i}.py`, 20 lines each ending in `# needle{i%50}`.
pub fn source_tree(files: usize) -> Result<Vec<u8>> {
    let mut b = tar::Builder::new(Vec::new());
    for i in 0..files {
        let body: String = (0..20)
            .map(|l| {
                format!(
                    "def function_{i}_{l}(x):\n    return x + {l}  # needle{}\n",
                    i % 50
                )
            })
            .collect();
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(
            &mut h,
            format!("pkg{}/sub{}/mod_{i}.py", i % 20, i % 7),
            body.as_bytes(),
        )?;
    }
    let tar = b.into_inner()?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    std::io::Write::write_all(&mut gz, &tar)?;
    Ok(gz.finish()?)
}

/// The snapshot benchmark's workload as one plain tar: the source tree of `files` files (the
/// layout of [`source_tree`]) and one incompressible file, `big/blob.bin`, of `big_bytes` bytes.
pub fn workload_tar(files: usize, big_bytes: usize) -> Result<Vec<u8>> {
    let tree = plain_tree(files)?;
    let mut b = tar::Builder::new(Vec::with_capacity(tree.len() + big_bytes + 4096));
    let mut archive = tar::Archive::new(&tree[..]);
    for entry in archive.entries()? {
        let mut e = entry?;
        let h = e.header().clone();
        b.append(&h, &mut e)?;
    }
    let data = noise(0x5eed, big_bytes);
    let mut h = tar::Header::new_gnu();
    h.set_size(big_bytes as u64);
    h.set_mode(0o644);
    h.set_cksum();
    b.append_data(&mut h, "big/blob.bin", &data[..])?;
    Ok(b.into_inner()?)
}

/// A `/proc/<pid>/status` field in KiB (`VmRSS:`, `VmHWM:`).
pub fn rss_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}
