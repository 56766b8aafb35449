//! cp-burst: fires a burst of concurrent requests of one kind at a running control plane and
//! reports how its memory answered: RSS before, the peak during the burst (sampled from
//! `/proc/<pid>/status` every 5 ms) and, per request, `(peak − before) / burst`; with the
//! statuses the burst got (a 429 is admission saying no) and how long it took. This is how the
//! per-request costs in docs/operations/admission.md were measured: with the
//! `MAX_CONCURRENT_*` limits raised past the burst, each request's share of the peak is what it
//! costs in flight.
//!
//! ```text
//! cp-burst --base http://127.0.0.1:8000 --key "$DAIV_SANDBOX_API_KEY" --pid <service pid> \
//!          --kind create|seed|read|grep|ls [--burst 50] [--sessions 8]
//! ```
//! `create` creates `--burst` sessions at once; the others first prepare `--sessions` sessions
//! one at a time (seeded with the source tree for `seed`; with a 500 KB file, and for `grep`
//! 200 lines of 2 KB that match, for the fs kinds), then send the burst spread over them. Every
//! session created is force-removed at the end. Nothing touches the network beyond `--base`.
//! `--rounds 2` sends a second burst on the same sessions (fs kinds).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use base64::Engine as _;
use clap::Parser;
use integration::cp::{Client, rss_kib, source_tree};
use serde_json::{Value, json};

#[derive(Parser, Debug)]
#[command(about = "Peak RSS of the control plane under a burst of concurrent requests of one kind")]
struct Args {
    #[command(flatten)]
    target: integration::cp::Target,
    /// The service's pid (its RSS is read from /proc).
    #[arg(long)]
    pid: u32,
    /// What the burst is made of: create, seed, read, grep or ls.
    #[arg(long)]
    kind: String,
    /// Requests sent at once.
    #[arg(long, default_value_t = 50)]
    burst: usize,
    /// Sessions the fs bursts are spread over (seed bursts use one per request).
    #[arg(long, default_value_t = 8)]
    sessions: usize,
    /// Files in each seed archive (gzipped source tree).
    #[arg(long, default_value_t = 200)]
    seed_files: usize,
    /// Bursts sent one after the other (fs kinds), each measured from the RSS before it: the
    /// second shows what a request holds in flight apart from what its session keeps after the
    /// first (its channel's read buffer).
    #[arg(long, default_value_t = 1)]
    rounds: usize,
}

/// The file the fs kinds read and grep: `LINES` lines of `LINE` bytes that all match `needle`.
const LINES: usize = 250;
const LINE: usize = 2000;
const FILE: &str = "/workspace/repo/burst.txt";

fn big_text() -> Vec<u8> {
    let mut line = "needle ".to_string();
    line.push_str(&"x".repeat(LINE - line.len() - 1));
    line.push('\n');
    line.repeat(LINES).into_bytes()
}

/// Sends one request of `kind`; its status (0 when it did not get an answer).
/// `id` is the session (none for a create, which uses `image`).
async fn one(
    c: &Client,
    kind: &str,
    id: &str,
    image: &str,
    archive: &[u8],
) -> (u16, Option<String>) {
    let r = match kind {
        "create" => c.create(image).await.map(Some),
        "seed" => c.seed(id, archive.to_vec()).await.map(|()| None),
        "read" => c
            .fs(id, "read", json!({"path": FILE, "limit": LINES}))
            .await
            .map(|_| None),
        "grep" => c
            .fs(
                id,
                "grep",
                json!({"path": "/workspace/repo", "pattern": "needle"}),
            )
            .await
            .map(|_| None),
        "ls" => c
            .fs(id, "ls", json!({"path": "/workspace/repo"}))
            .await
            .map(|_| None),
        _ => unreachable!("checked in main"),
    };
    match r {
        Ok(created) => (200, created),
        // The client's errors start with the method and path, then the status.
        Err(e) => (status_of(&format!("{e:#}")), None),
    }
}

fn status_of(message: &str) -> u16 {
    message
        .split_whitespace()
        .find_map(|w| w.parse::<u16>().ok().filter(|n| (100..600).contains(n)))
        .unwrap_or(0)
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = Args::parse();
    if !["create", "seed", "read", "grep", "ls"].contains(&a.kind.as_str()) {
        bail!("unknown kind {:?}", a.kind);
    }
    let c = Client::new(&a.target.base, &a.target.key, Duration::from_secs(600))?;
    let archive = Arc::new(source_tree(a.seed_files)?);
    let mut created: Vec<String> = Vec::new();

    // Preparation, one request at a time.
    let targets: Vec<String> = match a.kind.as_str() {
        "create" => vec![String::new(); a.burst],
        "seed" => {
            for _ in 0..a.burst {
                created.push(c.create(&a.target.image).await?);
            }
            created.clone()
        }
        _ => {
            let content = base64::engine::general_purpose::STANDARD.encode(big_text());
            for _ in 0..a.sessions.max(1) {
                let id = c.create(&a.target.image).await?;
                created.push(id.clone());
                c.fs(&id, "write", json!({"path": FILE, "content": content}))
                    .await
                    .context("prepare the file")?;
            }
            (0..a.burst)
                .map(|i| created[i % created.len()].clone())
                .collect()
        }
    };
    let rounds = if a.kind == "create" || a.kind == "seed" {
        1
    } else {
        a.rounds.max(1)
    };
    let mut reports = Vec::new();
    for round in 1..=rounds {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let before = rss_kib(a.pid, "VmRSS:").context("no such pid")?;

        let done = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(before));
        let sampler = tokio::spawn({
            let (done, peak, pid) = (done.clone(), peak.clone(), a.pid);
            async move {
                while !done.load(Ordering::Relaxed) {
                    if let Some(r) = rss_kib(pid, "VmRSS:") {
                        peak.fetch_max(r, Ordering::Relaxed);
                    }
                    tokio::time::sleep(Duration::from_millis(5)).await;
                }
            }
        });
        let started = Instant::now();
        let tasks: Vec<_> = targets
            .iter()
            .cloned()
            .map(|id| {
                let (c, kind, archive) = (c.clone(), a.kind.clone(), archive.clone());
                let image = a.target.image.clone();
                tokio::spawn(async move { one(&c, &kind, &id, &image, &archive).await })
            })
            .collect();
        let mut statuses: BTreeMap<u16, usize> = BTreeMap::new();
        for t in tasks {
            let (status, new) = t.await?;
            *statuses.entry(status).or_default() += 1;
            created.extend(new);
        }
        let elapsed = started.elapsed();
        done.store(true, Ordering::Relaxed);
        sampler.await?;
        let peak = peak.load(Ordering::Relaxed);
        let after = rss_kib(a.pid, "VmRSS:");
        let per_request = (peak.saturating_sub(before)) as f64 / a.burst as f64;
        println!(
            "round {round}: {} × {}: rss before {before} KiB, peak {peak} KiB (+{} KiB, {per_request:.0} KiB per request), statuses {statuses:?}, {:.1} s",
            a.burst,
            a.kind,
            peak.saturating_sub(before),
            elapsed.as_secs_f64()
        );
        reports.push(json!({
            "kind": a.kind,
            "round": round,
            "burst": a.burst,
            "statuses": statuses.iter().map(|(s, n)| (s.to_string(), json!(n))).collect::<serde_json::Map<String, Value>>(),
            "seconds": (elapsed.as_secs_f64() * 10.0).round() / 10.0,
            "rss_kib": {"before": before, "peak": peak, "after": after},
            "per_request_kib": per_request.round(),
        }));
    }
    for id in &created {
        let _ = c.delete(id, true).await;
    }
    println!("{}", serde_json::to_string_pretty(&reports)?);
    Ok(())
}
