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
//! `/proc/<pid>/status`, and its peak and end RSS while 8 sessions are busy at once for 10 s.
//! Beside those, the rows issue 12 asks for: a streaming run's first output line, a background
//! process poll that returns new output, and fs reads while a 30 s command holds the session.
//! `--sections a,b,...` runs only some of them (create, commands, seed, floors, fs, stream,
//! process, concurrent, busy, bigseed; default all). Archives are generated in memory,
//! deterministically; nothing touches the network beyond the given base URL. Every session
//! created is force-removed at the end.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
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
    /// Only these sections (comma list; default all): create, commands, seed, floors, fs,
    /// stream, process, concurrent, busy (needs `--pid`), bigseed (needs `--pid`).
    #[arg(long, value_delimiter = ',')]
    sections: Vec<String>,
}

/// Every section, in the order they run.
const SECTIONS: [&str; 10] = [
    "create",
    "commands",
    "seed",
    "floors",
    "fs",
    "stream",
    "process",
    "concurrent",
    "busy",
    "bigseed",
];

fn args() -> Result<Args> {
    let mut a = <Args as clap::Parser>::parse();
    a.target.base = a.target.base.trim_end_matches('/').to_string();
    a.sections.retain(|s| !s.trim().is_empty());
    for s in &mut a.sections {
        *s = s.trim().to_string();
        if !SECTIONS.contains(&s.as_str()) {
            bail!("unknown section {s:?}; known: {}", SECTIONS.join(","));
        }
    }
    Ok(a)
}

impl Args {
    /// The Docker socket, when it is there and not turned off.
    fn docker(&self) -> Option<&str> {
        Some(self.docker.as_str()).filter(|p| *p != "none" && std::path::Path::new(p).exists())
    }

    /// Whether section `name` runs (all of them without `--sections`).
    fn on(&self, name: &str) -> bool {
        self.sections.is_empty() || self.sections.iter().any(|s| s == name)
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
        println!("{:<40} {:>10} {:>10} {:>5}", "op", "p50 ms", "p95 ms", "n");
        for (op, v) in &self.0 {
            let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
            ms.sort_by(f64::total_cmp);
            let pct = |p: f64| ms[((ms.len() as f64 - 1.0) * p).round() as usize];
            let (p50, p95) = (pct(0.5), pct(0.95));
            println!("{op:<40} {p50:>10.1} {p95:>10.1} {:>5}", ms.len());
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
    let image = a.target.image.clone();
    let cmd = |k: usize| json!({"commands": vec!["true"; k]});
    let mut extra = json!({"image": a.target.image});
    // Sessions, a first command, close.
    if a.on("create") {
        section("create");
        for _ in 0..n {
            let t = Instant::now();
            let id = c.session(&image).await?;
            s.add("create session", t.elapsed());
            timed(
                s,
                "first run true",
                c.post(&format!("/session/{id}/"), cmd(1)),
            )
            .await?;
            timed(s, "DELETE (stop)", c.delete(&id, false)).await?;
        }
    }
    // Commands on a live session, beside the floor: one raw `docker exec true` through the
    // Docker API (create + start + inspect), which the issue's ratios are measured against.
    let exec_floor = a.on("floors").then(|| a.docker()).flatten();
    if a.on("commands") || exec_floor.is_some() {
        section("commands");
        let id = c.session(&image).await?;
        c.post(&format!("/session/{id}/"), cmd(1)).await?;
        for _ in 0..n {
            if a.on("commands") {
                timed(s, "run true", c.post(&format!("/session/{id}/"), cmd(1))).await?;
                timed(
                    s,
                    "run 10 x true",
                    c.post(&format!("/session/{id}/"), cmd(10)),
                )
                .await?;
            }
            if let Some(sock) = exec_floor {
                timed(s, "floor: docker exec true", docker::exec_true(sock, &id)).await?;
            }
        }
        c.delete(&id, true).await?;
    }
    // Seeds: a fresh session each (seeding is one-shot).
    let tree = source_tree(5000)?;
    if a.on("seed") {
        section("seed");
        let small = blob_tar(100, 10 * 1024)?;
        let large = blob_tar(300, 100 * 1024)?;
        let tree_2000 = source_tree(2000)?;
        extra["seed_5000_files_gz_bytes"] = json!(tree.len());
        for (label, archive, reps) in [
            ("seed 1 MB", &small, n),
            ("seed 30 MB", &large, n.min(5)),
            ("seed 2000 files (gz)", &tree_2000, n.min(5)),
            ("seed 5000 files (gz)", &tree, n.min(5)),
        ] {
            for _ in 0..reps {
                let id = c.session(&image).await?;
                timed(s, label, c.seed(&id, archive.clone())).await?;
                c.delete(&id, true).await?;
            }
        }
    }
    if let Some(sock) = a.on("floors").then(|| a.docker()).flatten() {
        section("floors");
        // The seeding floor: the same 5,000 files (uncompressed) through a raw put_archive.
        let plain = plain_tree(5000)?;
        for _ in 0..n.min(5) {
            let id = c.session(&image).await?;
            timed(
                s,
                "floor: put_archive 5000 files",
                docker::put_archive(sock, &id, "/workspace/tmp", plain.clone()),
            )
            .await?;
            c.delete(&id, true).await?;
        }
        // The other floor: the tar already in the container (put there untimed), extracted
        // onto the volume by the container's own tar, as the sandbox user, in one raw exec.
        let id = c.session(&image).await?;
        let mut wrap = tar::Builder::new(Vec::with_capacity(plain.len() + 4096));
        let mut h = tar::Header::new_gnu();
        h.set_size(plain.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        wrap.append_data(&mut h, "t.tar", &plain[..])?;
        docker::put_archive(sock, &id, "/workspace/tmp", wrap.into_inner()?).await?;
        for i in 0..n.min(5) {
            let script = format!(
                "mkdir /workspace/tmp/x{i} && tar -xf /workspace/tmp/t.tar -C /workspace/tmp/x{i}"
            );
            let t = Instant::now();
            let (code, out) =
                docker::exec(sock, &id, &["sh", "-c", &script], Some("1000:1000")).await?;
            let took = t.elapsed();
            if code != 0 {
                bail!("{script}: exit {code}: {}", String::from_utf8_lossy(&out));
            }
            s.add("floor: tar -x 5000 files onto the volume", took);
        }
        c.delete(&id, true).await?;
    }
    // fs ops on a seeded tree of 5,000 files.
    let r = "/workspace/repo";
    if a.on("fs") {
        section("fs");
        let id = c.session(&image).await?;
        c.seed(&id, tree.clone()).await?;
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
        c.delete(&id, true).await?;
    }
    // Issue 12: the first output line of a streaming run, from sending the request. The stream
    // is dropped then, which kills the batch; the next sample waits until a plain run on the
    // same session goes through again, and that run counts the `sleep 5`s still alive.
    if a.on("stream") {
        section("stream");
        let id = c.session(&image).await?;
        c.api.run_ok(&id, &["true"]).await?;
        // How many `sleep`s are alive; a plain run, retried until one goes through.
        let count_sleeps = async || -> Result<u64> {
            let t = Instant::now();
            loop {
                let run = json!({"commands": [COUNT_SLEEPS]});
                match c.post(&format!("/session/{id}/"), run).await {
                    Ok(v) => {
                        let out = v["results"][0]["output"].as_str().unwrap_or("");
                        return Ok(out.trim().parse().unwrap_or(0));
                    }
                    Err(_) if t.elapsed() < Duration::from_secs(60) => {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(e) => return Err(e.context("the session after a dropped stream")),
                }
            }
        };
        let (mut next_run_ms, mut alive_at_next_run, mut gone_ms) = (vec![], vec![], vec![]);
        for _ in 0..n.min(5) {
            timed(
                s,
                "stream first output byte",
                c.api.stream_first_output(&id, &["echo hi; sleep 5"]),
            )
            .await?;
            // Dropped: when the next run goes through, and when the killed `sleep 5` is gone
            // (polled every 20 ms; it would end by itself after 5 s).
            let dropped = Instant::now();
            let alive = count_sleeps().await?;
            next_run_ms.push(ms(dropped.elapsed()));
            alive_at_next_run.push(alive);
            let mut left = alive;
            while left > 0 && dropped.elapsed() < Duration::from_secs(10) {
                tokio::time::sleep(Duration::from_millis(20)).await;
                left = count_sleeps().await?;
            }
            gone_ms.push(ms(dropped.elapsed()));
        }
        extra["stream_after_drop"] = json!({
            "next_run_ms": next_run_ms,
            "sleeps_alive_at_next_run": alive_at_next_run,
            "sleep_gone_ms": gone_ms,
        });
        c.delete(&id, true).await?;
    }
    // Issue 12: polls of a background process that always has new output (it prints every
    // 200 ms; a poll every 250 ms, only the GET timed).
    if a.on("process") {
        section("process");
        let id = c.session(&image).await?;
        let v = c
            .post(
                &format!("/session/{id}/processes/"),
                json!({"command": "while true; do echo tick; sleep 0.2; done"}),
            )
            .await?;
        let pid = v["process_id"]
            .as_str()
            .context("no process_id")?
            .to_string();
        let poll = |off: u64, wait: u32| {
            format!("/session/{id}/processes/{pid}/?offset={off}&wait={wait}")
        };
        let mut off = c.api.get(&poll(0, 5)).await?["next_offset"]
            .as_u64()
            .context("no next_offset")?;
        let (mut got, mut empty) = (0, 0);
        while got < n {
            tokio::time::sleep(Duration::from_millis(250)).await;
            let t = Instant::now();
            let v = c.api.get(&poll(off, 0)).await?;
            let took = t.elapsed();
            if v["running"] != true {
                bail!("the process ended: {v}");
            }
            if v["output"].as_str().is_some_and(|o| !o.is_empty()) {
                s.add("process poll (new output)", took);
                got += 1;
            } else {
                empty += 1;
                if empty > n {
                    bail!("{empty} polls without new output");
                }
            }
            off = v["next_offset"].as_u64().context("no next_offset")?;
        }
        extra["process_polls_without_output"] = json!(empty);
        c.api
            .delete_path(&format!("/session/{id}/processes/{pid}/"))
            .await?;
        c.delete(&id, true).await?;
    }
    // Issue 12: fs reads on a session while a plain run holds its lock with `sleep 30`.
    if a.on("concurrent") {
        section("concurrent");
        let id = c.session(&image).await?;
        let path = format!("{r}/concurrent.txt");
        let content = "a line of the file read while a command runs\n".repeat(100);
        c.fs(
            &id,
            "write",
            json!({"path": path, "content": base64::engine::general_purpose::STANDARD.encode(content)}),
        )
        .await?;
        c.api.run_ok(&id, &["true"]).await?;
        let run = {
            let (api, id) = (c.api.clone(), id.clone());
            tokio::spawn(async move {
                api.post(
                    &format!("/session/{id}/"),
                    json!({"commands": ["sleep 30"]}),
                )
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut errors: Vec<String> = Vec::new();
        for _ in 0..n {
            let t = Instant::now();
            match c.fs(&id, "read", json!({"path": path})).await {
                Ok(_) => s.add("fs read during a 30 s command", t.elapsed()),
                Err(e) => errors.push(format!("{e:#}")),
            }
        }
        let overlapped = !run.is_finished();
        // A force delete waits for the session lock the run holds: give it 2 s, then drop the
        // run's request (a client that goes away cancels its batch) and remove the session.
        let t = Instant::now();
        let early = tokio::time::timeout(Duration::from_secs(2), c.delete(&id, true)).await;
        let force_delete_while_running = match &early {
            Ok(Ok(())) => json!({"ok_ms": ms(t.elapsed())}),
            Ok(Err(e)) => json!({"error": format!("{e:#}")}),
            Err(_) => json!("still waiting after 2 s"),
        };
        run.abort();
        let _ = run.await;
        if !matches!(early, Ok(Ok(()))) {
            let t = Instant::now();
            c.delete(&id, true).await?;
            extra["concurrent_force_delete_after_drop_ms"] = json!(ms(t.elapsed()));
        }
        extra["concurrent"] = json!({
            "reads_overlapped_the_run": overlapped,
            "read_errors": errors,
            "force_delete_while_running": force_delete_while_running,
        });
    }
    // Issue 11: the service's RSS while 8 sessions are driven at once, each by its own loop of
    // runs, fs reads and greps, for 10 s (VmRSS sampled every 50 ms).
    if let Some(pid) = a.pid.filter(|_| a.on("busy")) {
        section("busy");
        let small_tree = source_tree(500)?;
        let mut ids = Vec::new();
        for _ in 0..8 {
            let id = c.session(&image).await?;
            c.seed(&id, small_tree.clone()).await?;
            c.api.run_ok(&id, &["true"]).await?;
            ids.push(id);
        }
        let before = rss_kib(pid, "VmRSS:");
        let stop = Arc::new(AtomicBool::new(false));
        let sampler = {
            let stop = stop.clone();
            tokio::spawn(async move {
                let (mut peak, mut samples) = (0, 0u64);
                while !stop.load(Ordering::Relaxed) {
                    peak = rss_kib(pid, "VmRSS:").unwrap_or(0).max(peak);
                    samples += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                (peak, samples)
            })
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        let drivers: Vec<_> = ids
            .iter()
            .map(|id| {
                let (api, id) = (c.api.clone(), id.clone());
                tokio::spawn(async move {
                    let mut done: Vec<(&'static str, Duration)> = Vec::new();
                    let mut errors: Vec<String> = Vec::new();
                    let mut note = |op, t: Instant, r: Result<Value>| match r {
                        Ok(_) => done.push((op, t.elapsed())),
                        Err(e) => errors.push(format!("{op}: {e:#}")),
                    };
                    while Instant::now() < deadline {
                        let t = Instant::now();
                        note(
                            "busy x8: run echo hi",
                            t,
                            api.run_ok(&id, &["echo hi"]).await,
                        );
                        let t = Instant::now();
                        let read = json!({"path": "/workspace/repo/pkg1/sub1/mod_1.py"});
                        note("busy x8: fs read", t, api.fs(&id, "read", read).await);
                        let t = Instant::now();
                        let grep = json!({"path": "/workspace/repo", "pattern": "needle7$"});
                        note(
                            "busy x8: fs grep (500 files)",
                            t,
                            api.fs(&id, "grep", grep).await,
                        );
                    }
                    (done, errors)
                })
            })
            .collect();
        let mut errors = Vec::new();
        let mut ops = 0;
        for d in drivers {
            let (done, errs) = d.await?;
            ops += done.len();
            for (op, took) in done {
                s.add(op, took);
            }
            errors.extend(errs);
        }
        let end = rss_kib(pid, "VmRSS:");
        stop.store(true, Ordering::Relaxed);
        let (peak, samples) = sampler.await.unwrap_or((0, 0));
        for id in &ids {
            c.delete(id, true).await?;
        }
        errors.truncate(10);
        extra["busy_8_sessions"] = json!({
            "seconds": 10,
            "ops": ops,
            "errors": errors,
            "rss_before_kib": before,
            "rss_peak_kib": peak,
            "rss_end_kib": end,
            "rss_after_close_kib": rss_kib(pid, "VmRSS:"),
            "rss_samples": samples,
        });
    }
    // Peak RSS of the service while it seeds a big archive.
    if let Some(pid) = a.pid.filter(|_| a.on("bigseed")) {
        section("bigseed");
        let big = blob_tar(a.big_mb, 1024 * 1024)?;
        let id = c.session(&image).await?;
        let before = rss_kib(pid, "VmRSS:");
        let stop = Arc::new(AtomicBool::new(false));
        let stop2 = stop.clone();
        let sampler = tokio::spawn(async move {
            let mut peak = 0;
            while !stop2.load(Ordering::Relaxed) {
                peak = peak.max(rss_kib(pid, "VmRSS:").unwrap_or(0));
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            peak
        });
        let t = Instant::now();
        c.seed(&id, big).await?;
        let took = t.elapsed();
        stop.store(true, Ordering::Relaxed);
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

/// Prints which section starts (stderr, so stdout stays the table and the JSON).
fn section(name: &str) {
    eprintln!("cp-bench: {name}");
}

fn ms(d: Duration) -> f64 {
    (d.as_secs_f64() * 10_000.0).round() / 10.0
}

/// A run that prints how many `sleep` processes are alive in the sandbox (no `ps` needed).
const COUNT_SLEEPS: &str = "cat /proc/[0-9]*/stat 2>/dev/null | grep -c '(sleep)' || true";

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
    if let Some(b) = report["extra"].get("busy_8_sessions") {
        let mib = |k: &str| {
            b[k].as_f64()
                .map_or("?".into(), |v| format!("{:.1}", v / 1024.0))
        };
        println!(
            "control-plane RSS with 8 busy sessions: before {} MiB, peak {} MiB, end {} MiB ({} ops, {} errors)",
            mib("rss_before_kib"),
            mib("rss_peak_kib"),
            mib("rss_end_kib"),
            b["ops"],
            b["errors"].as_array().map_or(0, Vec::len),
        );
    }
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
        exec(sock, id, &["true"], None).await.map(|_| ())
    }

    /// `docker exec [--user <user>] <id> <cmd...>`: create, start (attached, until it ends),
    /// inspect; its exit code and its (multiplexed) output.
    pub async fn exec(
        sock: &str,
        id: &str,
        cmd: &[&str],
        user: Option<&str>,
    ) -> Result<(i64, Vec<u8>)> {
        let mut spec = serde_json::json!({"Cmd": cmd, "AttachStdout": true, "AttachStderr": true});
        if let Some(user) = user {
            spec["User"] = user.into();
        }
        let created = call(
            sock,
            "POST",
            &format!("/containers/{id}/exec"),
            serde_json::to_vec(&spec)?,
            "application/json",
        )
        .await?;
        let v: serde_json::Value = serde_json::from_slice(&created)?;
        let exec = v["Id"].as_str().context("exec id")?.to_string();
        let output = call(
            sock,
            "POST",
            &format!("/exec/{exec}/start"),
            br#"{"Detach":false,"Tty":false}"#.to_vec(),
            "application/json",
        )
        .await?;
        let state = call(
            sock,
            "GET",
            &format!("/exec/{exec}/json"),
            Vec::new(),
            "application/json",
        )
        .await?;
        let state: serde_json::Value = serde_json::from_slice(&state)?;
        Ok((state["ExitCode"].as_i64().unwrap_or(-1), output))
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
