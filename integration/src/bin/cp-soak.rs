//! cp-soak: keeps N sessions busy with mixed commands, fs ops and seeds for a set time against
//! any running control plane, then reports requests, errors, p50/p99 per operation, the
//! service's RSS at start and end (with `--pid`) and the Docker objects of its deployment left
//! (with `--deployment`), as a table and as JSON.
//!
//! ```text
//! cp-soak --base http://127.0.0.1:8000 --key "$DAIV_SANDBOX_API_KEY" \
//!         [--sessions 50] [--seconds 600] [--pid <service pid>] [--deployment NAME]
//! ```
//! Each worker owns one session: it seeds it, then loops over a weighted mix (runs, fs
//! write/read/edit/grep/glob/ls/delete, status) with a short pause between requests, and every
//! `--recycle` operations replaces its session by a new, freshly seeded one (create, seed and
//! force delete under load). Every result is checked (exit codes, fs errors, contents read
//! back), so an error is a wrong answer as much as a failed request. Nothing touches the
//! network beyond the given base URL; every session created is force-removed at the end.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use clap::Parser;
use integration::cp::{Client, rss_kib, source_tree};
use serde_json::json;
use tokio::sync::Mutex;

#[derive(Parser, Debug, Clone)]
#[command(about = "Soak the control plane: N busy sessions for a set time")]
struct Args {
    #[command(flatten)]
    target: integration::cp::Target,
    /// Sessions kept busy at once.
    #[arg(long, default_value_t = 50)]
    sessions: usize,
    /// How long the load lasts.
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Pause between two requests of a worker, in ms (jittered ±50%).
    #[arg(long, default_value_t = 100)]
    think_ms: u64,
    /// Operations after which a worker replaces its session (0: never).
    #[arg(long, default_value_t = 150)]
    recycle: u64,
    /// Files in each seed archive (gzipped source tree).
    #[arg(long, default_value_t = 200)]
    seed_files: usize,
    /// The service's pid, for its RSS (from /proc) at start, peak and end.
    #[arg(long)]
    pid: Option<u32>,
    /// The service's DAIV_SANDBOX_DEPLOYMENT, to count the Docker objects left at the end.
    #[arg(long)]
    deployment: Option<String>,
    /// Also write the JSON report here.
    #[arg(long)]
    json_out: Option<std::path::PathBuf>,
}

#[derive(Default)]
struct Op {
    ms: Vec<f64>,
    errors: u64,
}

#[derive(Default)]
struct Stats {
    ops: BTreeMap<&'static str, Op>,
    /// The first few error messages, for the report.
    samples: Vec<String>,
}

struct Shared {
    c: Client,
    image: String,
    stats: Mutex<Stats>,
    requests: AtomicU64,
    errors: AtomicU64,
    stop: AtomicBool,
    /// Every session created and not yet removed, for the final sweep.
    live: Mutex<Vec<String>>,
}

impl Shared {
    async fn timed<T>(
        &self,
        op: &'static str,
        f: impl std::future::Future<Output = Result<T>>,
    ) -> Result<T> {
        let t = Instant::now();
        let r = f.await;
        let ms = t.elapsed().as_secs_f64() * 1000.0;
        self.requests.fetch_add(1, Ordering::Relaxed);
        let mut s = self.stats.lock().await;
        let e = s.ops.entry(op).or_default();
        e.ms.push(ms);
        if let Err(err) = &r {
            e.errors += 1;
            self.errors.fetch_add(1, Ordering::Relaxed);
            if s.samples.len() < 20 {
                s.samples.push(format!("{op}: {err:#}"));
            }
        }
        r
    }
}

/// xorshift64: the workers' choices, reproducible per worker.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n.max(1)
    }
}

/// The mix: (weight, operation).
const MIX: &[(u64, &str)] = &[
    (14, "run"),
    (3, "run 5 commands"),
    (10, "fs write"),
    (12, "fs read"),
    (8, "fs edit"),
    (6, "fs grep"),
    (6, "fs glob"),
    (8, "fs ls"),
    (6, "fs delete"),
    (2, "status"),
];

fn pick(rng: &mut Rng) -> &'static str {
    let total: u64 = MIX.iter().map(|(w, _)| w).sum();
    let mut x = rng.below(total);
    for (w, op) in MIX {
        if x < *w {
            return op;
        }
        x -= w;
    }
    "run"
}

/// A fresh, seeded session.
async fn new_session(sh: &Shared, archive: &[u8]) -> Result<String> {
    let id = sh.timed("create session", sh.c.create(&sh.image)).await?;
    sh.live.lock().await.push(id.clone());
    sh.timed("seed", sh.c.seed(&id, archive.to_vec())).await?;
    Ok(id)
}

async fn remove(sh: &Shared, id: &str) -> Result<()> {
    let r = sh.timed("delete (force)", sh.c.delete(id, true)).await;
    if r.is_ok() {
        sh.live.lock().await.retain(|s| s != id);
    }
    r
}

/// A worker's state: its choices, and its own files that exist now (with their content).
struct Worker {
    n: usize,
    rng: Rng,
    files: Vec<(String, String)>,
    serial: u64,
    seed_files: usize,
}

/// One operation of the mix on `id`.
async fn one(sh: &Shared, id: &str, op: &'static str, w: &mut Worker) -> Result<()> {
    let repo = "/workspace/repo";
    let Worker {
        n: worker,
        rng,
        files,
        serial,
        seed_files,
    } = w;
    let (worker, seed_files) = (*worker, *seed_files);
    match op {
        "run" => {
            let k = rng.below(1000);
            let cmd = match rng.below(4) {
                0 => format!("echo soak-{k}"),
                1 => "ls pkg1 | wc -l".to_string(),
                2 => format!("i=0; while [ $i -lt {} ]; do i=$((i+1)); done; echo $i", k),
                _ => "cat pkg0/sub0/mod_0.py | grep -c needle".to_string(),
            };
            let v = sh.c.run_ok(id, &[&cmd]).await?;
            let out = v["results"][0]["output"].as_str().unwrap_or_default();
            if cmd.starts_with("echo") && out != format!("soak-{k}\n") {
                bail!("echo printed {out:?}");
            }
        }
        "run 5 commands" => {
            sh.c.run_ok(
                id,
                &["true", "pwd", "echo a > /tmp/x", "cat /tmp/x", "date"],
            )
            .await?;
        }
        "fs write" => {
            *serial += 1;
            let path = format!("{repo}/soak/w{worker}-{serial}.txt");
            let body = format!("worker {worker} file {serial}\nhello soak\n");
            sh.c.fs(
                id,
                "write",
                json!({"path": path, "content": base64(body.as_bytes())}),
            )
            .await?;
            files.push((path, body));
        }
        "fs read" => {
            if let Some((path, body)) = choose(files, rng) {
                let v = sh.c.fs(id, "read", json!({"path": path})).await?;
                // A page is its lines joined by newlines: the file's last newline is not part
                // of it (as in the reference).
                if v["content"].as_str() != Some(body.strip_suffix('\n').unwrap_or(body)) {
                    bail!("read {path}: {:?}, wrote {body:?}", v["content"]);
                }
            } else {
                let i = rng.below(seed_files as u64);
                let path = format!("{repo}/pkg{}/sub{}/mod_{i}.py", i % 20, i % 7);
                let v =
                    sh.c.fs(id, "read", json!({"path": path, "offset": 2, "limit": 4}))
                        .await?;
                if v["end_line"] != 6 {
                    bail!("read {path}: end_line {}", v["end_line"]);
                }
            }
        }
        "fs edit" => {
            let n = files.len();
            if n == 0 {
                return Box::pin(one(sh, id, "fs write", w)).await;
            }
            let i = rng.below(n as u64) as usize;
            let (path, body) = &mut files[i];
            let (old, new) = if body.contains("hello") {
                ("hello", "howdy")
            } else {
                ("howdy", "hello")
            };
            let v =
                sh.c.fs(id, "edit", json!({"path": path, "old": old, "new": new}))
                    .await?;
            if v["occurrences"] != 1 {
                bail!("edit {path}: {} occurrences", v["occurrences"]);
            }
            *body = body.replacen(old, new, 1);
        }
        "fs grep" => {
            let k = rng.below(50);
            let v =
                sh.c.fs(
                    id,
                    "grep",
                    json!({"path": repo, "pattern": format!("needle{k}$"), "glob": "*.py"}),
                )
                .await?;
            // Each file with i % 50 == k has 20 matching lines.
            let want = (0..seed_files).filter(|i| *i as u64 % 50 == k).count() * 20;
            let got = v["matches"].as_array().map_or(0, Vec::len);
            if got != want.min(200) {
                bail!("grep needle{k}: {got} matches, want {}", want.min(200));
            }
        }
        "fs glob" => {
            let v =
                sh.c.fs(id, "glob", json!({"path": repo, "pattern": "pkg1/**/*.py"}))
                    .await?;
            let want = (0..seed_files).filter(|i| i % 20 == 1).count();
            let got = v["matches"].as_array().map_or(0, Vec::len);
            if got != want {
                bail!("glob pkg1: {got} matches, want {want}");
            }
        }
        "fs ls" => {
            sh.c.fs(id, "ls", json!({"path": repo})).await?;
        }
        "fs delete" => {
            if files.is_empty() {
                return Box::pin(one(sh, id, "fs write", w)).await;
            }
            let i = rng.below(files.len() as u64) as usize;
            let (path, _) = files.swap_remove(i);
            let v = sh.c.fs(id, "delete", json!({"path": path})).await?;
            if v["removed"] != true {
                bail!("delete {path}: not removed");
            }
        }
        "status" => sh.c.status(id).await?,
        other => bail!("unknown op {other}"),
    }
    Ok(())
}

fn choose<'a>(files: &'a [(String, String)], rng: &mut Rng) -> Option<&'a (String, String)> {
    if files.is_empty() || rng.below(4) == 0 {
        return None; // sometimes a seeded file instead
    }
    files.get(rng.below(files.len() as u64) as usize)
}

fn base64(data: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(data)
}

async fn worker(sh: Arc<Shared>, n: usize, a: Args, archive: Arc<Vec<u8>>) {
    let mut w = Worker {
        n,
        rng: Rng(0x9E37_79B9_7F4A_7C15 ^ (n as u64 + 1).wrapping_mul(0x2545_F491_4F6C_DD1D)),
        files: Vec::new(),
        serial: 0,
        seed_files: a.seed_files,
    };
    'session: while !sh.stop.load(Ordering::Relaxed) {
        let id = match new_session(&sh, &archive).await {
            Ok(id) => id,
            Err(_) => {
                tokio::time::sleep(Duration::from_secs(1)).await;
                continue;
            }
        };
        w.files.clear();
        let mut done = 0;
        while !sh.stop.load(Ordering::Relaxed) {
            if a.recycle > 0 && done >= a.recycle {
                let _ = remove(&sh, &id).await;
                continue 'session;
            }
            let op = pick(&mut w.rng);
            let r = sh.timed(op, one(&sh, &id, op, &mut w)).await;
            if r.is_err() {
                // The worker's view of its files may be stale now: forget them.
                w.files.clear();
            }
            done += 1;
            let jitter = a.think_ms / 2 + w.rng.below(a.think_ms.max(1));
            tokio::time::sleep(Duration::from_millis(jitter)).await;
        }
        let _ = remove(&sh, &id).await;
    }
}

fn docker_objects(deployment: &str) -> Result<usize> {
    let label = format!("label=daiv.sandbox.deployment={deployment}");
    let mut n = 0;
    for args in [
        vec!["ps", "-aq", "--filter", &label],
        vec!["network", "ls", "-q", "--filter", &label],
    ] {
        let out = std::process::Command::new("docker")
            .args(&args)
            .output()
            .context("docker")?;
        if !out.status.success() {
            bail!("docker {args:?}: {}", String::from_utf8_lossy(&out.stderr));
        }
        n += String::from_utf8_lossy(&out.stdout).lines().count();
    }
    Ok(n)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    // Nearest rank.
    let rank = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    sorted[rank - 1]
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = Args::parse();
    let c = Client::new(&a.target.base, &a.target.key, Duration::from_secs(120))?;
    let archive = Arc::new(source_tree(a.seed_files)?);
    let sh = Arc::new(Shared {
        c,
        image: a.target.image.clone(),
        stats: Mutex::default(),
        requests: AtomicU64::new(0),
        errors: AtomicU64::new(0),
        stop: AtomicBool::new(false),
        live: Mutex::default(),
    });
    let rss = |f: &str| a.pid.and_then(|p| rss_kib(p, f));
    let rss_start = rss("VmRSS:");
    let started = Instant::now();
    let peak = Arc::new(AtomicU64::new(rss_start.unwrap_or(0)));
    let mut rss_series = Vec::new();
    let workers: Vec<_> = (0..a.sessions)
        .map(|n| tokio::spawn(worker(sh.clone(), n, a.clone(), archive.clone())))
        .collect();
    let deadline = started + Duration::from_secs(a.seconds);
    let mut last_print = Instant::now();
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_secs(1).min(deadline - Instant::now())).await;
        if let Some(r) = rss("VmRSS:") {
            peak.fetch_max(r, Ordering::Relaxed);
        }
        if last_print.elapsed() >= Duration::from_secs(30) {
            last_print = Instant::now();
            let r = rss("VmRSS:");
            rss_series.push(json!({"t_s": started.elapsed().as_secs(), "rss_kib": r}));
            eprintln!(
                "cp-soak: {:>4} s  requests {:>7}  errors {:>4}  rss {} KiB",
                started.elapsed().as_secs(),
                sh.requests.load(Ordering::Relaxed),
                sh.errors.load(Ordering::Relaxed),
                r.map_or("?".into(), |r| r.to_string()),
            );
        }
    }
    sh.stop.store(true, Ordering::Relaxed);
    for w in workers {
        let _ = w.await;
    }
    let elapsed = started.elapsed();
    // Whatever a failed delete left.
    for id in std::mem::take(&mut *sh.live.lock().await) {
        let _ = sh.c.delete(&id, true).await;
    }
    // Let the service settle (its per-session state is dropped on removal) before the last RSS.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let rss_end = rss("VmRSS:");
    let left = match &a.deployment {
        Some(d) => Some(docker_objects(d)?),
        None => None,
    };

    let stats = sh.stats.lock().await;
    let mut rows = Vec::new();
    println!(
        "{:<16} {:>8} {:>7} {:>9} {:>9} {:>9}",
        "op", "n", "errors", "p50 ms", "p99 ms", "max ms"
    );
    for (op, o) in &stats.ops {
        let mut ms = o.ms.clone();
        ms.sort_by(f64::total_cmp);
        let (p50, p99, max) = (pct(&ms, 0.5), pct(&ms, 0.99), pct(&ms, 1.0));
        println!(
            "{op:<16} {:>8} {:>7} {p50:>9.1} {p99:>9.1} {max:>9.1}",
            ms.len(),
            o.errors
        );
        rows.push(json!({"op": op, "n": ms.len(), "errors": o.errors,
            "p50_ms": round1(p50), "p99_ms": round1(p99), "max_ms": round1(max)}));
    }
    let requests = sh.requests.load(Ordering::Relaxed);
    let errors = sh.errors.load(Ordering::Relaxed);
    let report = json!({
        "sessions": a.sessions,
        "seconds": round1(elapsed.as_secs_f64()),
        "requests": requests,
        "requests_per_s": round1(requests as f64 / elapsed.as_secs_f64()),
        "errors": errors,
        "error_samples": stats.samples,
        "ops": rows,
        "rss_kib": {"start": rss_start, "peak": peak.load(Ordering::Relaxed), "end": rss_end,
            "vm_hwm": rss("VmHWM:"), "series": rss_series},
        "docker_objects_left": left,
        "image": a.target.image,
    });
    println!(
        "requests {requests} ({:.1}/s), errors {errors}, rss start/peak/end {} / {} / {} KiB, docker objects left {}",
        requests as f64 / elapsed.as_secs_f64(),
        rss_start.map_or("?".into(), |r| r.to_string()),
        peak.load(Ordering::Relaxed),
        rss_end.map_or("?".into(), |r| r.to_string()),
        left.map_or("?".into(), |n| n.to_string()),
    );
    for s in &stats.samples {
        println!("  error: {s}");
    }
    let text = serde_json::to_string_pretty(&report)?;
    if let Some(p) = &a.json_out {
        std::fs::write(p, &text)?;
    }
    println!("{text}");
    if errors > 0 || left.is_some_and(|n| n > 0) {
        bail!("{errors} errors, {} Docker objects left", left.unwrap_or(0));
    }
    Ok(())
}
