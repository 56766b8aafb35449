//! cp-bench: latency of the control plane's session, command, seed and fs operations against any
//! running instance, printed as a table (p50/p95/n per op) and as JSON.
//!
//! ```text
//! cp-bench --base http://127.0.0.1:8000 --key "$DAIV_SANDBOX_API_KEY" \
//!          [--image daiv-sandbox-busybox:local] [--n 20] [--pid <service pid>] [--big-mb 200]
//! ```
//! `--docker` (default `/var/run/docker.sock` when present; `none` to skip) adds the floors the
//! targets are stated against: a raw `docker exec true` (create + start + inspect) into a live
//! session and a raw `put_archive` of the 5,000-file tree.
//! `--pid` (a local service) adds its peak RSS while seeding a `--big-mb` archive, sampled from
//! `/proc/<pid>/status`. Archives are generated in memory, deterministically; nothing touches the
//! network beyond the given base URL. Every session created is force-removed at the end.

use std::time::{Duration, Instant};

use anyhow::Result;
use integration::cp::{Client as Api, blob_tar, plain_tree, rss_kib, source_tree};
use serde_json::{Value, json};

#[derive(clap::Parser, Debug)]
#[command(about = "Latency per operation of a running control plane, beside the raw Docker floors")]
struct Args {
    #[command(flatten)]
    target: integration::cp::Target,
    /// Samples per operation.
    #[arg(long, default_value_t = 20)]
    n: usize,
    /// The service's pid, for its RSS.
    #[arg(long)]
    pid: Option<u32>,
    /// Size of the large-output and large-seed cases, in MB.
    #[arg(long, default_value_t = 200)]
    big_mb: usize,
    /// The Docker socket, for the floors (raw exec, raw put_archive); `none` skips them.
    #[arg(long, default_value = "/var/run/docker.sock")]
    docker: String,
}

fn args() -> Result<Args> {
    let mut a = <Args as clap::Parser>::parse();
    a.target.base = a.target.base.trim_end_matches('/').to_string();
    Ok(a)
}

impl Args {
    /// The Docker socket, when it is there and not turned off.
    fn docker(&self) -> Option<&str> {
        Some(self.docker.as_str()).filter(|p| *p != "none" && std::path::Path::new(p).exists())
    }
}

/// The shared API client, plus the sessions this run created (force-removed at the end).
struct Client {
    api: Api,
    created: Vec<String>,
}

impl Client {
    async fn post(&self, path: &str, body: Value) -> Result<Value> {
        self.api.post(path, body).await
    }

    async fn session(&mut self, image: &str) -> Result<String> {
        let id = self.api.create(image).await?;
        self.created.push(id.clone());
        Ok(id)
    }

    async fn delete(&self, id: &str, force: bool) -> Result<()> {
        self.api.delete(id, force).await
    }

    async fn seed(&self, id: &str, archive: Vec<u8>) -> Result<()> {
        self.api.seed(id, archive).await
    }

    async fn fs(&self, id: &str, op: &str, body: Value) -> Result<Value> {
        self.api.fs(id, op, body).await
    }
}

#[derive(Default)]
struct Samples(Vec<(String, Vec<Duration>)>);

impl Samples {
    fn add(&mut self, op: &str, d: Duration) {
        match self.0.iter_mut().find(|(o, _)| o == op) {
            Some((_, v)) => v.push(d),
            None => self.0.push((op.to_string(), vec![d])),
        }
    }

    fn report(&self, extra: Value) -> Value {
        let mut rows = Vec::new();
        println!("{:<28} {:>10} {:>10} {:>5}", "op", "p50 ms", "p95 ms", "n");
        for (op, v) in &self.0 {
            let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
            ms.sort_by(f64::total_cmp);
            let pct = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
            let (p50, p95) = (pct(0.5), pct(0.95));
            println!("{op:<28} {p50:>10.1} {p95:>10.1} {:>5}", ms.len());
            rows.push(json!({"op": op, "p50_ms": (p50 * 10.0).round() / 10.0, "p95_ms": (p95 * 10.0).round() / 10.0, "n": ms.len()}));
        }
        json!({"results": rows, "extra": extra})
    }
}

async fn timed<T>(
    s: &mut Samples,
    op: &str,
    f: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    let t = Instant::now();
    let v = f.await?;
    s.add(op, t.elapsed());
    Ok(v)
}

async fn bench(a: &Args, c: &mut Client, s: &mut Samples) -> Result<Value> {
    let n = a.n;
    let cmd = |k: usize| json!({"commands": vec!["true"; k]});
    // Sessions, a first command, close.
    for _ in 0..n {
        let t = Instant::now();
        let id = c.session(&a.target.image).await?;
        s.add("create session", t.elapsed());
        timed(
            s,
            "first run true",
            c.post(&format!("/session/{id}/"), cmd(1)),
        )
        .await?;
        timed(s, "DELETE (stop)", c.delete(&id, false)).await?;
    }
    // Commands on a live session, beside the floor: one raw `docker exec true` through the
    // Docker API (create + start + inspect), which the issue's ratios are measured against.
    let id = c.session(&a.target.image).await?;
    c.post(&format!("/session/{id}/"), cmd(1)).await?;
    for _ in 0..n {
        timed(s, "run true", c.post(&format!("/session/{id}/"), cmd(1))).await?;
        timed(
            s,
            "run 10 x true",
            c.post(&format!("/session/{id}/"), cmd(10)),
        )
        .await?;
        if let Some(sock) = a.docker() {
            timed(s, "floor: docker exec true", docker::exec_true(sock, &id)).await?;
        }
    }
    c.delete(&id, true).await?;
    // Seeds: a fresh session each (seeding is one-shot).
    let small = blob_tar(100, 10 * 1024)?;
    let large = blob_tar(300, 100 * 1024)?;
    let tree = source_tree(5000)?;
    let tree_len = tree.len();
    let tree_2000 = source_tree(2000)?;
    for (label, archive, reps) in [
        ("seed 1 MB", &small, n),
        ("seed 30 MB", &large, n.min(5)),
        ("seed 2000 files (gz)", &tree_2000, n.min(5)),
        ("seed 5000 files (gz)", &tree, n.min(5)),
    ] {
        for _ in 0..reps {
            let id = c.session(&a.target.image).await?;
            timed(s, label, c.seed(&id, archive.clone())).await?;
            c.delete(&id, true).await?;
        }
    }
    // The seeding floor: the same 5,000 files (uncompressed) through a raw put_archive.
    if let Some(sock) = a.docker() {
        let plain = plain_tree(5000)?;
        for _ in 0..n.min(5) {
            let id = c.session(&a.target.image).await?;
            timed(
                s,
                "floor: put_archive 5000 files",
                docker::put_archive(sock, &id, "/workspace/tmp", plain.clone()),
            )
            .await?;
            c.delete(&id, true).await?;
        }
    }
    // fs ops on a seeded tree of 5,000 files.
    let id = c.session(&a.target.image).await?;
    c.seed(&id, tree.clone()).await?;
    let r = "/workspace/repo";
    for i in 0..n {
        timed(
            s,
            "fs ls",
            c.fs(&id, "ls", json!({"path": format!("{r}/pkg1")})),
        )
        .await?;
        timed(
            s,
            "fs read",
            c.fs(
                &id,
                "read",
                json!({"path": format!("{r}/pkg1/sub1/mod_1.py")}),
            ),
        )
        .await?;
        timed(
            s,
            "fs grep (5000 files)",
            c.fs(&id, "grep", json!({"path": r, "pattern": "needle7$"})),
        )
        .await?;
        timed(
            s,
            "fs glob (5000 files)",
            c.fs(&id, "glob", json!({"path": r, "pattern": "**/mod_1*.py"})),
        )
        .await?;
        let p = format!("{r}/bench/w{i}.txt");
        timed(
            s,
            "fs write",
            c.fs(&id, "write", json!({"path": p, "content": "aGVsbG8K"})),
        )
        .await?;
        timed(
            s,
            "fs edit",
            c.fs(
                &id,
                "edit",
                json!({"path": p, "old": "hello", "new": "howdy"}),
            ),
        )
        .await?;
        timed(s, "fs delete", c.fs(&id, "delete", json!({"path": p}))).await?;
    }
    let mut extra = json!({"seed_5000_files_gz_bytes": tree_len, "image": a.target.image});
    // Peak RSS of the service while it seeds a big archive.
    if let Some(pid) = a.pid {
        let big = blob_tar(a.big_mb, 1024 * 1024)?;
        let id = c.session(&a.target.image).await?;
        let before = rss_kib(pid, "VmRSS:");
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let stop2 = stop.clone();
        let sampler = tokio::spawn(async move {
            let mut peak = 0;
            while !stop2.load(std::sync::atomic::Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid, "VmRSS:").unwrap_or(0));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            peak
        });
        let t = Instant::now();
        c.seed(&id, big).await?;
        let took = t.elapsed();
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let peak = sampler.await.unwrap_or(0);
        extra["big_seed"] = json!({
            "archive_mb": a.big_mb,
            "seconds": took.as_secs_f64(),
            "rss_before_kib": before,
            "rss_peak_during_kib": peak,
            "vm_hwm_kib": rss_kib(pid, "VmHWM:"),
        });
    }
    Ok(extra)
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let mut c = Client {
        api: Api::new(&a.target.base, &a.target.key, Duration::from_secs(600))?,
        created: Vec::new(),
    };
    let mut s = Samples::default();
    let result = bench(&a, &mut c, &mut s).await;
    for id in std::mem::take(&mut c.created) {
        let _ = c.delete(&id, true).await;
    }
    let extra = result?;
    let report = s.report(extra);
    println!("{}", serde_json::to_string_pretty(&report)?);
    Ok(())
}

/// Raw Docker Engine API calls over the unix socket, one connection per call (as a client
/// without keep-alive would): the floors the service is compared with.
mod docker {
    use anyhow::{Context, Result, bail};
    use http_body_util::{BodyExt, Full};
    use hyper::Request;
    use hyper_util::rt::TokioIo;

    async fn call(
        sock: &str,
        method: &str,
        path: &str,
        body: Vec<u8>,
        ctype: &str,
    ) -> Result<Vec<u8>> {
        let stream = tokio::net::UnixStream::connect(sock)
            .await
            .with_context(|| format!("connect {sock}"))?;
        let (mut tx, conn) =
            hyper::client::conn::http1::handshake::<_, Full<bytes::Bytes>>(TokioIo::new(stream))
                .await?;
        tokio::spawn(conn);
        let req = Request::builder()
            .method(method)
            .uri(format!("http://docker{path}"))
            .header("Host", "docker")
            .header("Content-Type", ctype)
            .body(Full::new(bytes::Bytes::from(body)))?;
        let resp = tx.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes().to_vec();
        if !status.is_success() {
            bail!(
                "{method} {path}: {status} {}",
                String::from_utf8_lossy(&bytes)
            );
        }
        Ok(bytes)
    }

    /// `docker exec <id> true`: create, start (attached, until it ends), inspect.
    pub async fn exec_true(sock: &str, id: &str) -> Result<()> {
        let created = call(
            sock,
            "POST",
            &format!("/containers/{id}/exec"),
            br#"{"Cmd":["true"],"AttachStdout":true,"AttachStderr":true}"#.to_vec(),
            "application/json",
        )
        .await?;
        let v: serde_json::Value = serde_json::from_slice(&created)?;
        let exec = v["Id"].as_str().context("exec id")?.to_string();
        call(
            sock,
            "POST",
            &format!("/exec/{exec}/start"),
            br#"{"Detach":false,"Tty":false}"#.to_vec(),
            "application/json",
        )
        .await?;
        call(
            sock,
            "GET",
            &format!("/exec/{exec}/json"),
            Vec::new(),
            "application/json",
        )
        .await?;
        Ok(())
    }

    /// `PUT /containers/<id>/archive?path=<dir>` of a plain tar.
    pub async fn put_archive(sock: &str, id: &str, dir: &str, tar: Vec<u8>) -> Result<()> {
        call(
            sock,
            "PUT",
            &format!("/containers/{id}/archive?path={dir}"),
            tar,
            "application/x-tar",
        )
        .await?;
        Ok(())
    }
}
