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
//! process, concurrent, busy, bigseed, snapshots; default all). Archives are generated in memory,
//! deterministically; nothing touches the network beyond the given base URL (and the local
//! Docker socket). Every session created is force-removed at the end, and every snapshot,
//! image and scratch copy made is removed.
//!
//! `snapshots` measures snapshots, forks and pause on the issue's workload: a
//! `--snapshot-image` session (default `daiv-sandbox-debian:local`) seeded with 5,000 files and
//! one `--snapshot-mb` (100) MB file, with 2 MB written to `~/.cache/x`. Its rows, p50/p95/n as
//! everywhere (the heavy ones `min(n, 5)` times), and the ratios printed after the table:
//! 1. `snapshot` beside its floors on the same container: a raw `docker commit` (through the
//!    socket; the image removed again) and a raw `cp -a` of the workspace volume's directory on
//!    the host (its mount's source, into the temp directory, then removed), each also after
//!    `sync; echo 3 > /proc/sys/vm/drop_caches` (cold; needs root). Printed: commit + cp and
//!    snapshot / (commit + cp), warm and cold. With `--service-log <file>` (the service's
//!    output) the `snapshot taken` lines' frozen/commit/copy times are reported too;
//! 2. `create from snapshot` of that snapshot and of a tiny one (an `--image` session with an
//!    empty workspace), beside cold creates of both images;
//! 3. `fork 1` and `fork 8` beside a snapshot plus 1 or 8 creates from it (side by side);
//! 4. `pause` beside a raw `docker pause` and `docker unpause` of another idle session, and the
//!    first `run true` after a pause beside one on a running session;
//! 5. with `--pool-base URL --pool-snapshot ID`, `create from snapshot (warm pool claim)`: creates
//!    on a second instance of the same deployment and key started with
//!    `DAIV_SANDBOX_WARM_POOL_SNAPSHOTS=ID=<--pool-size>`, each once its pool is full again.
//!    The snapshot must exist before that instance starts: `cp-bench --make-snapshot` makes the
//!    workload's, prints its id and keeps it (see below).
//!
//! The warm-pool row, step by step (the first instance on :8391, deployment `bench`):
//! ```text
//! SNAP=$(cp-bench --base http://127.0.0.1:8391 --key k --make-snapshot)
//! DAIV_SANDBOX_WARM_POOL_SNAPSHOTS=$SNAP=4 DAIV_SANDBOX_WARM_POOL_REMOVE_ON_SHUTDOWN=true \
//!   DAIV_SANDBOX_PORT=8392 <the first instance's other settings> daiv-sandbox &
//! cp-bench --base http://127.0.0.1:8391 --key k --sections snapshots \
//!          --pool-base http://127.0.0.1:8392 --pool-snapshot $SNAP --pool-size 4
//! kill -INT <the second instance's pid>   # its members go (REMOVE_ON_SHUTDOWN)
//! curl -X DELETE -H 'X-API-Key: k' http://127.0.0.1:8391/api/v1/snapshots/$SNAP/
//! ```

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use integration::cp::{Client as Api, blob_tar, plain_tree, rss_kib, source_tree, workload_tar};
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
    /// Only these sections (comma list; default all): create, commands, mcp, seed, floors, fs,
    /// stream, process, concurrent, busy (needs `--pid`), bigseed (needs `--pid`), snapshots.
    #[arg(long, value_delimiter = ',')]
    sections: Vec<String>,
    /// The image of the `snapshots` workload session (its tiny snapshot is of `--image`).
    #[arg(long, default_value = "daiv-sandbox-debian:local")]
    snapshot_image: String,
    /// Size of the `snapshots` workload's one big file, in MB.
    #[arg(long, default_value_t = 100)]
    snapshot_mb: usize,
    /// The service's log (its stdout and stderr), for the `snapshot taken` timings.
    #[arg(long)]
    service_log: Option<std::path::PathBuf>,
    /// A second instance (same deployment and key) with a warm pool of `--pool-snapshot`, for
    /// the `snapshots` section's warm-pool row.
    #[arg(long, requires = "pool_snapshot")]
    pool_base: Option<String>,
    /// The snapshot that instance pools (`DAIV_SANDBOX_WARM_POOL_SNAPSHOTS=<id>=<pool-size>`).
    #[arg(long, requires = "pool_base")]
    pool_snapshot: Option<String>,
    /// That pool's configured size (each claim waits until it is full again).
    #[arg(long, default_value_t = 4)]
    pool_size: u64,
    /// Only make the `snapshots` workload's snapshot (for `--pool-snapshot`): print its id and
    /// exit, keeping it (its session is removed). Delete it with `DELETE /snapshots/{id}/`.
    #[arg(long)]
    make_snapshot: bool,
}

/// Every section, in the order they run.
const SECTIONS: [&str; 12] = [
    "create",
    "commands",
    "mcp",
    "seed",
    "floors",
    "fs",
    "stream",
    "process",
    "concurrent",
    "busy",
    "bigseed",
    "snapshots",
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

/// The shared API client, plus the sessions this run created (force-removed at the end) and
/// what else it made that outlives them (removed after them).
struct Client {
    api: Api,
    created: Vec<String>,
    made: Made,
}

/// What the `snapshots` section made besides sessions, until it is removed.
#[derive(Default)]
struct Made {
    /// Snapshots (with a record): `DELETE /snapshots/{id}/`.
    snapshots: Vec<String>,
    /// Forks' snapshots (no record): their image and data volume, through the Docker socket.
    fork_payloads: Vec<String>,
    /// Images of the `docker commit` floor.
    images: Vec<String>,
    /// Copies of the `cp -a` floor.
    scratch: Vec<std::path::PathBuf>,
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

    /// `POST /session/` with `body` (a session from a snapshot, ...).
    async fn session_with(&mut self, body: Value) -> Result<String> {
        let id = self.api.create_with(body).await?;
        self.created.push(id.clone());
        Ok(id)
    }

    /// Force-removes a session of this run now.
    async fn remove(&mut self, id: &str) -> Result<()> {
        self.api.delete(id, true).await?;
        self.created.retain(|c| c != id);
        Ok(())
    }

    /// Snapshots session `id`: the snapshot's id and the 201's body.
    async fn snapshot(&mut self, id: &str) -> Result<(String, Value)> {
        let v = self.api.snapshot(id, json!({"name": "cp-bench"})).await?;
        let sid = v["snapshot_id"]
            .as_str()
            .context("snapshot_id")?
            .to_string();
        self.made.snapshots.push(sid.clone());
        Ok((sid, v))
    }

    async fn delete_snapshot(&mut self, sid: &str) -> Result<()> {
        self.api.delete_snapshot(sid).await?;
        self.made.snapshots.retain(|s| s != sid);
        Ok(())
    }

    /// `POST /session/{id}/fork/` of `count`.
    async fn fork(&mut self, id: &str, count: u32) -> Result<Vec<String>> {
        let ids = self.api.fork(id, count).await?;
        self.created.extend(ids.iter().cloned());
        Ok(ids)
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

    /// The median of `op`, in ms (as the table computes it).
    fn p50(&self, op: &str) -> Option<f64> {
        let (_, v) = self.0.iter().find(|(o, _)| o == op)?;
        let mut ms: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1000.0).collect();
        ms.sort_by(f64::total_cmp);
        Some(ms[((ms.len() as f64 - 1.0) * 0.5).round() as usize])
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
    // MCP's `run` tool beside the native route, one after the other on one session: the
    // overhead of the MCP door (a stateful MCP session, as an MCP client keeps, its answer an
    // event stream) over the same operation.
    if a.on("mcp") {
        section("mcp");
        let id = c.session(&image).await?;
        c.post(&format!("/session/{id}/"), cmd(1)).await?;
        let mcp = Mcp::connect(&a.target).await?;
        mcp.run(&id, "true").await?;
        for _ in 0..n {
            timed(
                s,
                "native run true",
                c.post(&format!("/session/{id}/"), cmd(1)),
            )
            .await?;
            timed(s, "mcp run true", mcp.run(&id, "true")).await?;
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
    if a.on("snapshots") {
        section("snapshots");
        extra["snapshots"] = snapshots(a, c, s).await?;
    }
    Ok(extra)
}

/// Files in the `snapshots` workload's tree.
const WORKLOAD_FILES: usize = 5000;
/// The workload's change in the home directory: 2 MB in `~/.cache/x`.
const HOME_CHANGE: &str =
    "mkdir -p \"$HOME/.cache\" && head -c 2097152 /dev/urandom > \"$HOME/.cache/x\"";
/// What a session from the workload's snapshot must have.
const WORKLOAD_CHECK: &str = "test -s /workspace/repo/big/blob.bin && test -f /workspace/repo/pkg1/sub1/mod_1.py && test -s \"$HOME/.cache/x\"";
/// The repository of snapshot images and the data volume's name (the service's naming).
const SNAPSHOT_REPOSITORY: &str = "daiv-sandbox-snapshot";
/// The repository of the `docker commit` floor's images.
const FLOOR_REPOSITORY: &str = "cp-bench-floor";

/// The issue's workload: a `--snapshot-image` session seeded with 5,000 files and one
/// `--snapshot-mb` MB file, with 2 MB written to `~/.cache/x`.
async fn workload_session(a: &Args, c: &mut Client) -> Result<String> {
    let archive = workload_tar(WORKLOAD_FILES, a.snapshot_mb * 1024 * 1024)?;
    let id = c.session(&a.snapshot_image).await?;
    c.seed(&id, archive).await?;
    c.api.run_ok(&id, &[HOME_CHANGE]).await?;
    Ok(id)
}

/// `--make-snapshot`: the workload's snapshot, kept (for a warm pool of it); its session goes.
async fn make_snapshot(a: &Args, c: &mut Client) -> Result<Value> {
    let w = workload_session(a, c).await?;
    let (sid, v) = c.snapshot(&w).await?;
    c.made.snapshots.retain(|s| *s != sid);
    c.remove(&w).await?;
    eprintln!("cp-bench: snapshot {sid} kept ({} bytes)", v["size_bytes"]);
    Ok(json!({"snapshot_id": sid}))
}

/// The `snapshots` section (see the top of the file); its extra (sizes, timings, ratios, and
/// `summary`, the lines printed after the table).
async fn snapshots(a: &Args, c: &mut Client, s: &mut Samples) -> Result<Value> {
    let (n, hn) = (a.n, a.n.min(5));
    let sock = a.docker();
    let run_true = json!({"commands": ["true"]});
    let mut extra = json!({
        "workload": {
            "image": a.snapshot_image,
            "files": WORKLOAD_FILES,
            "big_file_mb": a.snapshot_mb,
            "home_change_mb": 2,
        },
        "tiny": {"image": a.target.image},
    });
    // Which sample each snapshot was, for the service's `snapshot taken` lines.
    let mut taken: Vec<(String, &'static str)> = Vec::new();
    let log_from = a
        .service_log
        .as_ref()
        .and_then(|p| std::fs::metadata(p).ok())
        .map_or(0, |m| m.len());

    let w = workload_session(a, c).await?;
    // 1. The snapshot and its floors, on the same container.
    let cold = match drop_caches().await {
        Ok(()) => true,
        Err(e) => {
            extra["cold_skipped"] = json!(format!("{e:#}"));
            false
        }
    };
    extra["cold_cache_rows"] = json!(cold);
    let source = match sock {
        Some(sock) => Some(workspace_source(sock, &w).await?),
        None => None,
    };
    extra["workspace_volume_dir"] = json!(source);
    for i in 0..hn {
        let (sid, v) = timed(s, "snapshot", c.snapshot(&w)).await?;
        extra["workload"]["size_bytes"] = v["size_bytes"].clone();
        taken.push((sid.clone(), "snapshot"));
        c.delete_snapshot(&sid).await?;
        if let (Some(sock), Some(source)) = (sock, &source) {
            commit_floor(c, s, sock, &w, "floor: docker commit").await?;
            cp_floor(c, s, source, i, "floor: cp -a workspace").await?;
            if cold {
                drop_caches().await?;
                commit_floor(c, s, sock, &w, "floor: docker commit, cold cache").await?;
                drop_caches().await?;
                cp_floor(c, s, source, i, "floor: cp -a workspace, cold cache").await?;
            }
        }
        if cold {
            drop_caches().await?;
            let (sid, _) = timed(s, "snapshot, cold cache", c.snapshot(&w)).await?;
            taken.push((sid.clone(), "snapshot, cold cache"));
            c.delete_snapshot(&sid).await?;
        }
    }

    // 2. Sessions from the workload's snapshot and from a tiny one, beside cold creates.
    let (big, _) = c.snapshot(&w).await?;
    taken.push((big.clone(), "snapshot for the creates and forks"));
    let check = c.session_with(json!({"snapshot_id": big})).await?;
    c.api
        .run_ok(&check, &[WORKLOAD_CHECK])
        .await
        .context("a session from the workload's snapshot")?;
    c.remove(&check).await?;
    // A first run before the freeze (see the raw pause below for why).
    let t = c.session(&a.target.image).await?;
    c.post(&format!("/session/{t}/"), run_true.clone()).await?;
    let (tiny, v) = c.snapshot(&t).await?;
    extra["tiny"]["size_bytes"] = v["size_bytes"].clone();
    taken.push((tiny.clone(), "tiny snapshot"));
    c.remove(&t).await?;
    for _ in 0..n {
        for (op, body) in [
            (
                "create from snapshot (workload)",
                json!({"snapshot_id": big}),
            ),
            (
                "cold create (workload image)",
                json!({"base_image": a.snapshot_image}),
            ),
            ("create from snapshot (tiny)", json!({"snapshot_id": tiny})),
            (
                "cold create (tiny image)",
                json!({"base_image": a.target.image}),
            ),
        ] {
            let id = timed(s, op, c.session_with(body)).await?;
            c.remove(&id).await?;
        }
    }
    c.delete_snapshot(&tiny).await?;

    // 2b. A session from the workload's snapshot with 10 MB changed in its workspace: its
    // snapshot and its fork copy that change only, a layer over the snapshot's.
    for _ in 0..hn {
        let from = c.session_with(json!({"snapshot_id": big})).await?;
        c.api
            .run_ok(
                &from,
                &["head -c 10485760 /dev/urandom > /workspace/repo/changed.bin"],
            )
            .await
            .context("10 MB changed")?;
        let (sid, _) = timed(
            s,
            "snapshot of a session from a snapshot (10 MB changed)",
            c.snapshot(&from),
        )
        .await?;
        taken.push((sid.clone(), "snapshot of a session from a snapshot"));
        let forks = timed(
            s,
            "fork 1 of a session from a snapshot (10 MB changed)",
            c.fork(&from, 1),
        )
        .await?;
        remove_forks(c, sock, &forks).await?;
        c.delete_snapshot(&sid).await?;
        c.remove(&from).await?;
    }

    // 3. Forks, beside a snapshot plus creates from it.
    for _ in 0..hn {
        for count in [1u32, 8] {
            let forks = timed(s, &format!("fork {count}"), c.fork(&w, count)).await?;
            remove_forks(c, sock, &forks).await?;
            let started = Instant::now();
            let (sid, _) = c.snapshot(&w).await?;
            let creates = (0..count).map(|_| c.api.create_with(json!({"snapshot_id": sid})));
            let made = futures::future::join_all(creates).await;
            let took = started.elapsed();
            taken.push((
                sid.clone(),
                match count {
                    1 => "snapshot + 1 create",
                    _ => "snapshot + 8 creates",
                },
            ));
            let mut ids = Vec::new();
            let mut failed = None;
            for r in made {
                match r {
                    Ok(id) => ids.push(id),
                    Err(e) => failed = Some(e),
                }
            }
            c.created.extend(ids.iter().cloned());
            if let Some(e) = failed {
                return Err(e.context(format!("snapshot + {count} creates")));
            }
            let op = match count {
                1 => "snapshot + 1 create from it".to_string(),
                _ => format!("snapshot + {count} creates (side by side)"),
            };
            s.add(&op, took);
            for id in &ids {
                c.remove(id).await?;
            }
            c.delete_snapshot(&sid).await?;
        }
    }
    c.delete_snapshot(&big).await?;
    c.remove(&w).await?;

    // 4. Pause, and the first request after it, beside the raw pause and unpause of another
    // idle session.
    let p = c.session(&a.snapshot_image).await?;
    c.post(&format!("/session/{p}/"), run_true.clone()).await?;
    // Its helper's channel is open before the first raw pause: a `docker exec` starting while
    // the container freezes can hang runc's exec and the unpause behind it (runc 1.1, cgroup v1:
    // the cgroup stays FROZEN). Every session this section freezes has had a run first.
    let q = match sock {
        Some(_) => {
            let q = c.session(&a.snapshot_image).await?;
            c.post(&format!("/session/{q}/"), run_true.clone()).await?;
            Some(q)
        }
        None => None,
    };
    for _ in 0..n {
        timed(s, "pause", c.api.pause(&p)).await?;
        timed(
            s,
            "first run true after pause",
            c.post(&format!("/session/{p}/"), run_true.clone()),
        )
        .await?;
        timed(
            s,
            "run true (running)",
            c.post(&format!("/session/{p}/"), run_true.clone()),
        )
        .await?;
        if let (Some(sock), Some(q)) = (sock, &q) {
            timed(
                s,
                "floor: docker pause",
                docker::post(sock, &format!("/containers/{q}/pause")),
            )
            .await?;
            timed(
                s,
                "floor: docker unpause",
                docker::post(sock, &format!("/containers/{q}/unpause")),
            )
            .await?;
        }
    }
    c.remove(&p).await?;
    if let Some(q) = &q {
        c.remove(q).await?;
    }

    // 5. Claims from a warm pool of a snapshot, on the instance that keeps one.
    if let (Some(base), Some(sid)) = (&a.pool_base, &a.pool_snapshot) {
        let pool = Api::new(base, &a.target.key, Duration::from_secs(600))?;
        let filter = format!("image=\"snapshot:{sid}\"");
        let (mut claims, mut misses) = (0.0, 0.0);
        for _ in 0..n {
            let deadline = Instant::now() + Duration::from_secs(300);
            loop {
                let size = pool.metric("daiv_sandbox_pool_size", &filter).await?;
                if size as u64 >= a.pool_size {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "the pool of {sid} did not reach {} members (at {size})",
                        a.pool_size
                    );
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            let c0 = pool
                .metric("daiv_sandbox_pool_claims_total", &filter)
                .await?;
            let m0 = pool
                .metric("daiv_sandbox_pool_misses_total", &filter)
                .await?;
            let started = Instant::now();
            let id = pool.create_with(json!({"snapshot_id": sid})).await;
            let took = started.elapsed();
            let id = id?;
            c.created.push(id.clone());
            s.add("create from snapshot (warm pool claim)", took);
            claims += pool
                .metric("daiv_sandbox_pool_claims_total", &filter)
                .await?
                - c0;
            misses += pool
                .metric("daiv_sandbox_pool_misses_total", &filter)
                .await?
                - m0;
            c.remove(&id).await?;
        }
        extra["warm_pool"] = json!({"base": base, "snapshot_id": sid, "size": a.pool_size, "claims": claims, "misses": misses});
    }

    // Where the snapshots' time went, from the service's log.
    if let Some(path) = &a.service_log {
        let lines = snapshot_log(path, log_from);
        let mut by: Vec<(&str, Vec<[f64; 3]>)> = Vec::new();
        for (sid, label) in &taken {
            if let Some(t) = lines.iter().find(|(id, _)| id == sid).map(|(_, t)| *t) {
                match by.iter_mut().find(|(l, _)| l == label) {
                    Some((_, v)) => v.push(t),
                    None => by.push((label, vec![t])),
                }
            }
        }
        let median = |v: &[[f64; 3]], k: usize| {
            let mut x: Vec<f64> = v.iter().map(|t| t[k]).collect();
            x.sort_by(f64::total_cmp);
            x[(x.len() - 1) / 2]
        };
        extra["service_timings_p50_ms"] = by
            .iter()
            .map(|(l, v)| {
                (
                    l.to_string(),
                    json!({"frozen": median(v, 0), "commit": median(v, 1), "copy": median(v, 2), "n": v.len()}),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into();
    }
    extra["summary"] = json!(summary(s, &extra));
    Ok(extra)
}

/// The lines printed after the table: the rows against their floors and the cold creates.
fn summary(s: &Samples, extra: &Value) -> Vec<String> {
    let p = |op: &str| s.p50(op);
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => format!("{:.2}x", a / b),
        _ => "-".to_string(),
    };
    let f = |v: Option<f64>| v.map_or("-".to_string(), |v| format!("{v:.1} ms"));
    let sum = |a: Option<f64>, b: Option<f64>| Some(a? + b?);
    let mb = |v: &Value| v.as_f64().map_or(f64::NAN, |b| b / 1e6);
    let mut out = vec![format!(
        "snapshots (p50): workload snapshot {:.1} MB, tiny snapshot {:.1} MB",
        mb(&extra["workload"]["size_bytes"]),
        mb(&extra["tiny"]["size_bytes"]),
    )];
    for (label, snap, commit, cp) in [
        (
            "warm",
            "snapshot",
            "floor: docker commit",
            "floor: cp -a workspace",
        ),
        (
            "cold cache",
            "snapshot, cold cache",
            "floor: docker commit, cold cache",
            "floor: cp -a workspace, cold cache",
        ),
    ] {
        if p(snap).is_none() {
            continue;
        }
        let floor = sum(p(commit), p(cp));
        let beside = p(commit).zip(p(cp)).map(|(a, b)| a.max(b));
        out.push(format!(
            "  snapshot ({label}) {} vs commit {} + cp -a {} = {}: snapshot/(commit+cp) {} (vs the larger of the two, {}: {})",
            f(p(snap)),
            f(p(commit)),
            f(p(cp)),
            f(floor),
            ratio(p(snap), floor),
            f(beside),
            ratio(p(snap), beside),
        ));
    }
    if let Some(t) = extra
        .get("service_timings_p50_ms")
        .and_then(Value::as_object)
    {
        for (label, v) in t {
            let ms = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
            let total = match label.as_str() {
                "snapshot" | "snapshot, cold cache" => p(label),
                _ => None,
            };
            let outside = total.map_or(String::new(), |t| {
                format!(", outside the freeze {:.0} ms", t - ms("frozen"))
            });
            out.push(format!(
                "  service's `snapshot taken` ({label}, n={}): frozen {:.0} ms (commit {:.0} ms beside copy {:.0} ms){outside}",
                v["n"],
                ms("frozen"),
                ms("commit"),
                ms("copy"),
            ));
        }
    }
    let cold = p("cold create (workload image)");
    out.push(format!(
        "  create from snapshot: workload {} ({} of cold {}), tiny {} ({} of cold {})",
        f(p("create from snapshot (workload)")),
        ratio(p("create from snapshot (workload)"), cold),
        f(cold),
        f(p("create from snapshot (tiny)")),
        ratio(
            p("create from snapshot (tiny)"),
            p("cold create (tiny image)")
        ),
        f(p("cold create (tiny image)")),
    ));
    for (fork, manual) in [
        ("fork 1", "snapshot + 1 create from it"),
        ("fork 8", "snapshot + 8 creates (side by side)"),
    ] {
        out.push(format!(
            "  {fork} {} vs {manual} {}: {}",
            f(p(fork)),
            f(p(manual)),
            ratio(p(fork), p(manual)),
        ));
    }
    let floor = sum(p("floor: docker pause"), p("floor: docker unpause"));
    out.push(format!(
        "  pause {} vs docker pause {} ({}); first run true after pause {} vs running {} (+{}) vs docker unpause {}; docker pause+unpause {}",
        f(p("pause")),
        f(p("floor: docker pause")),
        ratio(p("pause"), p("floor: docker pause")),
        f(p("first run true after pause")),
        f(p("run true (running)")),
        f(sum(p("first run true after pause"), p("run true (running)").map(|v| -v))),
        f(p("floor: docker unpause")),
        f(floor),
    ));
    if let Some(claim) = p("create from snapshot (warm pool claim)") {
        out.push(format!(
            "  warm pool claim {} ({} of cold create, {} of create from snapshot; target 50 ms): {} claims, {} misses",
            f(Some(claim)),
            ratio(Some(claim), cold),
            ratio(Some(claim), p("create from snapshot (workload)")),
            extra["warm_pool"]["claims"],
            extra["warm_pool"]["misses"],
        ));
    }
    out
}

/// The host directory of session `id`'s `/workspace` volume (its mount's source).
async fn workspace_source(sock: &str, id: &str) -> Result<String> {
    let v = docker::inspect(sock, id).await?;
    v["Mounts"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|m| m["Destination"] == "/workspace")
        .and_then(|m| m["Source"].as_str())
        .map(str::to_string)
        .context("the session has no /workspace mount")
}

/// One raw `docker commit` of `id` (the CLI's defaults: paused while it runs), timed as `op`;
/// the image is removed again (untimed).
async fn commit_floor(
    c: &mut Client,
    s: &mut Samples,
    sock: &str,
    id: &str,
    op: &str,
) -> Result<()> {
    let tag = format!("{}-{}", std::process::id(), c.made.images.len());
    let image = format!("{FLOOR_REPOSITORY}:{tag}");
    c.made.images.push(image.clone());
    let path = format!("/commit?container={id}&repo={FLOOR_REPOSITORY}&tag={tag}");
    timed(s, op, docker::post(sock, &path)).await?;
    docker::delete(sock, &format!("/images/{image}")).await?;
    c.made.images.retain(|i| *i != image);
    Ok(())
}

/// One `cp -a` of the workspace volume's directory into the temp directory, timed as `op`; the
/// copy is removed again (untimed).
async fn cp_floor(c: &mut Client, s: &mut Samples, source: &str, i: usize, op: &str) -> Result<()> {
    let to = std::env::temp_dir().join(format!("cp-bench-cp-{}-{i}", std::process::id()));
    c.made.scratch.push(to.clone());
    let started = Instant::now();
    let status = tokio::process::Command::new("cp")
        .arg("-a")
        .arg(source)
        .arg(&to)
        .status()
        .await
        .context("cp")?;
    let took = started.elapsed();
    if !status.success() {
        bail!("cp -a {source} {}: {status}", to.display());
    }
    s.add(op, took);
    tokio::fs::remove_dir_all(&to).await?;
    c.made.scratch.retain(|p| *p != to);
    Ok(())
}

/// `sync; echo 3 > /proc/sys/vm/drop_caches` (root only): the next reads come from the disk.
async fn drop_caches() -> Result<()> {
    let status = tokio::process::Command::new("sync").status().await?;
    if !status.success() {
        bail!("sync: {status}");
    }
    tokio::fs::write("/proc/sys/vm/drop_caches", "3")
        .await
        .context("echo 3 > /proc/sys/vm/drop_caches")
}

/// Force-removes forks, then their snapshot's image and data volume (it has no record: the
/// service's reaper would collect them only after the grace period) through the Docker socket;
/// without one they are the reaper's.
async fn remove_forks(c: &mut Client, sock: Option<&str>, forks: &[String]) -> Result<()> {
    let payload = match (sock, forks.first()) {
        (Some(sock), Some(first)) => {
            docker::inspect(sock, first).await?["Config"]["Labels"]["daiv.sandbox.snapshot"]
                .as_str()
                .map(str::to_string)
        }
        _ => None,
    };
    for id in forks {
        c.remove(id).await?;
    }
    if let (Some(sock), Some(sid)) = (sock, payload) {
        c.made.fork_payloads.push(sid.clone());
        remove_payload(sock, &sid).await?;
        c.made.fork_payloads.retain(|p| *p != sid);
    }
    Ok(())
}

/// A snapshot's image and data volume (the service's names).
async fn remove_payload(sock: &str, sid: &str) -> Result<()> {
    // A snapshot that committed nothing named its base image, a name the service drops once
    // its forks hold the layer: gone already is done.
    let image = docker::delete(sock, &format!("/images/{SNAPSHOT_REPOSITORY}:{sid}")).await;
    if let Err(e) = image
        && !format!("{e:#}").contains("404")
    {
        return Err(e);
    }
    docker::delete(sock, &format!("/volumes/daiv-snapshot-{sid}-data")).await
}

/// Removes what the run made besides sessions (those are gone already): snapshots, forks'
/// snapshot payloads, floor images and copies. Best effort; what is left is named on stderr.
async fn cleanup(a: &Args, c: &mut Client) {
    let made = std::mem::take(&mut c.made);
    for sid in made.snapshots {
        if let Err(e) = c.api.delete_snapshot(&sid).await {
            eprintln!("cp-bench: snapshot {sid} left: {e:#}");
        }
    }
    if let Some(sock) = a.docker() {
        for sid in made.fork_payloads {
            if let Err(e) = remove_payload(sock, &sid).await {
                eprintln!("cp-bench: fork snapshot {sid} left: {e:#}");
            }
        }
        for image in made.images {
            if let Err(e) = docker::delete(sock, &format!("/images/{image}")).await {
                eprintln!("cp-bench: image {image} left: {e:#}");
            }
        }
    }
    for dir in made.scratch {
        if dir.exists()
            && let Err(e) = std::fs::remove_dir_all(&dir)
        {
            eprintln!("cp-bench: {} left: {e}", dir.display());
        }
    }
}

/// The `snapshot taken` lines of the service's log from byte `from`: per snapshot id, its
/// frozen, commit and copy times in ms. Text (ANSI colours or not) and JSON logs alike.
fn snapshot_log(path: &std::path::Path, from: u64) -> Vec<(String, [f64; 3])> {
    let Ok(bytes) = std::fs::read(path) else {
        return Vec::new();
    };
    let text = String::from_utf8_lossy(bytes.get(from as usize..).unwrap_or_default());
    text.lines()
        .filter(|l| l.contains("snapshot taken"))
        .filter_map(|l| {
            let l = strip_ansi(l);
            let num = |k: &str| field(&l, k)?.parse::<f64>().ok();
            Some((
                field(&l, "snapshot_id")?.to_string(),
                [num("frozen_ms")?, num("commit_ms")?, num("copy_ms")?],
            ))
        })
        .collect()
}

/// A log line without its ANSI colour sequences.
fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(ch) = chars.next() {
        if ch == '\u{1b}' {
            for e in chars.by_ref() {
                if e.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(ch);
        }
    }
    out
}

/// Field `key` of a log line: `key=value` (text) or `"key":value` (JSON), quotes trimmed.
fn field<'a>(line: &'a str, key: &str) -> Option<&'a str> {
    let text = format!(" {key}=");
    let json = format!("\"{key}\":");
    let start = line
        .find(&text)
        .map(|i| i + text.len())
        .or_else(|| line.find(&json).map(|i| i + json.len()))?;
    let rest = &line[start..];
    let end = rest.find([' ', ',', '}']).unwrap_or(rest.len());
    Some(rest[..end].trim_matches('"'))
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
        made: Made::default(),
    };
    let mut s = Samples::default();
    let result = if a.make_snapshot {
        make_snapshot(&a, &mut c).await
    } else {
        bench(&a, &mut c, &mut s).await
    };
    for id in std::mem::take(&mut c.created) {
        let _ = c.delete(&id, true).await;
    }
    cleanup(&a, &mut c).await;
    let extra = result?;
    if a.make_snapshot {
        println!("{}", extra["snapshot_id"].as_str().unwrap_or_default());
        return Ok(());
    }
    let report = s.report(extra);
    for line in report["extra"]["snapshots"]["summary"]
        .as_array()
        .into_iter()
        .flatten()
    {
        println!("{}", line.as_str().unwrap_or_default());
    }
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
/// An MCP client as one keeps it: initialized once, its session id on every call.
struct Mcp {
    http: reqwest::Client,
    url: String,
    key: String,
    session: String,
}

impl Mcp {
    async fn connect(t: &integration::cp::Target) -> Result<Self> {
        let mut m = Self {
            http: reqwest::Client::builder()
                .timeout(Duration::from_secs(60))
                .build()?,
            url: format!("{}/mcp", t.base),
            key: t.key.clone(),
            session: String::new(),
        };
        let init = json!({"jsonrpc": "2.0", "id": 0, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "cp-bench", "version": "0"}}});
        let r = m.send(&init).await?;
        m.session = r
            .headers()
            .get("mcp-session-id")
            .and_then(|v| v.to_str().ok())
            .context("no mcp-session-id")?
            .to_string();
        r.bytes().await?;
        let done = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        m.send(&done).await?.bytes().await?;
        Ok(m)
    }

    async fn send(&self, body: &Value) -> Result<reqwest::Response> {
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(&self.key)
            .header("accept", "application/json, text/event-stream")
            .header("mcp-protocol-version", "2025-06-18")
            .json(body);
        if !self.session.is_empty() {
            req = req.header("mcp-session-id", &self.session);
        }
        let r = req.send().await?;
        if !r.status().is_success() {
            bail!("MCP {}: {}", r.status(), r.text().await.unwrap_or_default());
        }
        Ok(r)
    }

    /// The `run` tool with one command; an error unless it ran and exited 0.
    async fn run(&self, session_id: &str, command: &str) -> Result<()> {
        let call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
            "name": "run", "arguments": {"session_id": session_id, "commands": [command]}}});
        let text = self.send(&call).await?.text().await?;
        // JSON, or the last `data:` event of an event stream.
        let v: Value = serde_json::from_str(&text).or_else(|_| {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
                .next_back()
                .context("no answer in the event stream")
        })?;
        if v["result"]["isError"] != json!(false) {
            bail!("MCP run: {v}");
        }
        Ok(())
    }
}

mod docker {
    use anyhow::{Context, Result, bail};
    use http_body_util::{BodyExt, Full};
    use hyper::Request;
    use hyper_util::rt::TokioIo;

    /// One call, given up after 10 minutes (a hung engine call fails the run, not hangs it).
    async fn call(
        sock: &str,
        method: &str,
        path: &str,
        body: Vec<u8>,
        ctype: &str,
    ) -> Result<Vec<u8>> {
        tokio::time::timeout(
            std::time::Duration::from_secs(600),
            call_once(sock, method, path, body, ctype),
        )
        .await
        .map_err(|_| anyhow::anyhow!("{method} {path}: no answer within 10 minutes"))?
    }

    async fn call_once(
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

    /// `GET /containers/<id>/json`.
    pub async fn inspect(sock: &str, id: &str) -> Result<serde_json::Value> {
        let v = call(
            sock,
            "GET",
            &format!("/containers/{id}/json"),
            Vec::new(),
            "application/json",
        )
        .await?;
        Ok(serde_json::from_slice(&v)?)
    }

    /// A `POST` without a body (`/containers/<id>/pause`, `/commit?...`).
    pub async fn post(sock: &str, path: &str) -> Result<()> {
        call(sock, "POST", path, Vec::new(), "application/json")
            .await
            .map(drop)
    }

    /// A `DELETE` (`/images/<ref>`, `/volumes/<name>`).
    pub async fn delete(sock: &str, path: &str) -> Result<()> {
        call(sock, "DELETE", path, Vec::new(), "application/json")
            .await
            .map(drop)
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
