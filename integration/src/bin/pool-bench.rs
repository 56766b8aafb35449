//! pool-bench: `POST /session/` from a warm pool against cold creates, in one run.
//!
//! ```text
//! pool-bench --pool-base http://127.0.0.1:8001 --cold-base http://127.0.0.1:8002 --key KEY \
//!            [--cold-key KEY] [--image daiv-sandbox-busybox:local] [--n 50] [--pool-size 4] \
//!            [--egress] [--env]
//! ```
//! The instance at `--pool-base` has `DAIV_SANDBOX_WARM_POOL` (or `..._EGRESS` with `--egress`)
//! set to `IMAGE=<pool-size>`; the one at `--cold-base` has no pool (same engine). Phases, each
//! timed per request and reported as p50/p90/max:
//! 1. `pool back-to-back`: `--n` creates one after the other on the pooled instance, as fast as
//!    they come (the pool empties; misses fall back to cold creates), with its claims and misses;
//! 2. `pool claim`: creates that each wait for the pool to be full again first, so every one is
//!    a claim (the claim latency alone);
//! 3. `cold`: `--n` creates on the instance without a pool.
//!
//! Every create must succeed; every session is force-removed after its phase (not timed).
//! With `--egress` each create carries a policy, in effect when the 201 returns.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

#[derive(clap::Parser, Debug)]
#[command(about = "POST /session/ from a warm pool against cold creates")]
struct Args {
    /// Origin of the service with the warm pool.
    #[arg(long)]
    pool_base: String,
    /// Origin of the service without one.
    #[arg(long)]
    cold_base: String,
    /// The API key (of both, unless --cold-key).
    #[arg(long, env = "DAIV_SANDBOX_API_KEY", hide_env_values = true)]
    key: String,
    #[arg(long)]
    cold_key: Option<String>,
    #[arg(long, default_value = "daiv-sandbox-busybox:local")]
    image: String,
    /// Sessions created on each side.
    #[arg(long, default_value_t = 50)]
    n: usize,
    /// The pool's configured size (to wait for it to refill).
    #[arg(long, default_value_t = 4)]
    pool_size: u64,
    /// Egress sessions (the pool's egress kind).
    #[arg(long)]
    egress: bool,
    /// Each create also carries an `environment` (applied at claim time).
    #[arg(long)]
    env: bool,
}

fn args() -> Result<Args> {
    Ok(<Args as clap::Parser>::parse())
}

struct Target {
    http: reqwest::Client,
    base: String,
    key: String,
}

impl Target {
    async fn create(&self, body: &Value) -> Result<(String, Duration)> {
        let started = Instant::now();
        let r = self
            .http
            .post(format!("{}/api/v1/session/", self.base))
            .header("X-API-Key", &self.key)
            .json(body)
            .send()
            .await?;
        let status = r.status();
        let v: Value = r.json().await.unwrap_or(Value::Null);
        let took = started.elapsed();
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

    /// Sum of a metric family's samples whose line contains `filter`.
    async fn metric(&self, name: &str, filter: &str) -> Result<f64> {
        let text = self
            .http
            .get(format!("{}/metrics", self.base))
            .header("X-API-Key", &self.key)
            .send()
            .await?
            .text()
            .await?;
        Ok(text
            .lines()
            .filter(|l| l.starts_with(name) && l.contains(filter))
            .filter(|l| l[name.len()..].starts_with(['{', ' ']))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum())
    }
}

struct Phase {
    name: &'static str,
    took: Vec<Duration>,
    note: String,
}

fn pct(sorted: &[Duration], p: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((p * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i].as_secs_f64() * 1000.0
}

#[tokio::main]
async fn main() -> Result<()> {
    let a = args()?;
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let pool = Target {
        http: http.clone(),
        base: a.pool_base.trim_end_matches('/').to_string(),
        key: a.key.clone(),
    };
    let cold = Target {
        http,
        base: a.cold_base.trim_end_matches('/').to_string(),
        key: a.cold_key.clone().unwrap_or_else(|| a.key.clone()),
    };
    let kind = if a.egress { "egress" } else { "isolated" };
    let mut body = json!({"base_image": a.image});
    if a.env {
        body["environment"] = json!({"POOL_BENCH": "claimed"});
    }
    if a.egress {
        body["egress"] = json!({"policy": {"default": "deny", "rules": [{"host": "api.upstream.test", "methods": ["GET"]}]}});
    }
    let size_filter = format!("image=\"{}\",kind=\"{kind}\"", a.image);
    let full = || async {
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let size = pool.metric("daiv_sandbox_pool_size", &size_filter).await?;
            if size as u64 >= a.pool_size {
                return Ok::<_, anyhow::Error>(());
            }
            if Instant::now() > deadline {
                bail!("the pool did not reach {} members (at {size})", a.pool_size);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };

    let mut phases = Vec::new();
    // 1. Back to back on the pool.
    full().await?;
    let claims0 = pool
        .metric("daiv_sandbox_pool_claims_total", &size_filter)
        .await?;
    let misses0 = pool
        .metric("daiv_sandbox_pool_misses_total", &size_filter)
        .await?;
    let mut ids = Vec::new();
    let mut took = Vec::new();
    for _ in 0..a.n {
        let (id, t) = pool.create(&body).await?;
        ids.push(id);
        took.push(t);
    }
    let claims = pool
        .metric("daiv_sandbox_pool_claims_total", &size_filter)
        .await?
        - claims0;
    let misses = pool
        .metric("daiv_sandbox_pool_misses_total", &size_filter)
        .await?
        - misses0;
    phases.push(Phase {
        name: "pool back-to-back",
        took,
        note: format!("{claims} claims, {misses} misses (cold)"),
    });
    for id in ids.drain(..) {
        pool.remove(&id).await;
    }
    // 2. Claims only: the pool full before each.
    let mut took = Vec::new();
    let paced = a.n.min(20);
    for _ in 0..paced {
        full().await?;
        let (id, t) = pool.create(&body).await?;
        ids.push(id);
        took.push(t);
    }
    phases.push(Phase {
        name: "pool claim",
        took,
        note: "pool full before each".into(),
    });
    for id in ids.drain(..) {
        pool.remove(&id).await;
    }
    // 3. Cold.
    let mut took = Vec::new();
    for _ in 0..a.n {
        let (id, t) = cold.create(&body).await?;
        ids.push(id);
        took.push(t);
    }
    phases.push(Phase {
        name: "cold",
        took,
        note: "no pool".into(),
    });
    for id in ids.drain(..) {
        cold.remove(&id).await;
    }

    println!(
        "POST /session/ ({kind}, {}, pool of {})",
        a.image, a.pool_size
    );
    println!(
        "{:<20} {:>5} {:>9} {:>9} {:>9}  note",
        "phase", "n", "p50 ms", "p90 ms", "max ms"
    );
    let mut report = Vec::new();
    for p in &mut phases {
        p.took.sort();
        let (p50, p90, max) = (pct(&p.took, 0.5), pct(&p.took, 0.9), pct(&p.took, 1.0));
        println!(
            "{:<20} {:>5} {:>9.1} {:>9.1} {:>9.1}  {}",
            p.name,
            p.took.len(),
            p50,
            p90,
            max,
            p.note
        );
        report.push(json!({"phase": p.name, "n": p.took.len(), "p50_ms": p50, "p90_ms": p90, "max_ms": max, "note": p.note}));
    }
    println!(
        "{}",
        json!({"kind": kind, "image": a.image, "phases": report})
    );
    Ok(())
}
