//! code-bench: what the code interpreter costs, beside its floor, in one run.
//!
//! ```text
//! code-bench --base http://127.0.0.1:8000 --e2b http://127.0.0.1:49983 --key KEY \
//!            [--image daiv-sandbox-code-interpreter:local] [--n 50] [--creates 5] [--pool N]
//! ```
//! Phases, each timed per request (p50/p90/max), after one warm-up call each:
//! 1. `in-sandbox floor`: `curl` to the interpreter on 127.0.0.1:49999 inside the sandbox
//!    (`docker exec`, timed by curl): the kernel and the server, no relay;
//! 2. `native /code`: `POST /session/{id}/code` `1+1`, read to its end;
//! 3. `e2b /execute`: the same through the E2B port, as E2B's SDK sends it (`E2b-Sandbox-Id`,
//!    `E2b-Sandbox-Port: 49999`, `X-Access-Token`);
//! 4. `create + first /code`: `--creates` times, a session created and its first `1+1` answered
//!    (with `--pool N`, the service has a warm pool of `--image`: each create is a claim, after the
//!    pool is full again);
//! 5. memory: the resident set of the server and of each kernel in an idle session (`ps`).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};

#[derive(clap::Parser, Debug)]
#[command(about = "The code interpreter's round trips, its cold and warm start, its memory")]
struct Args {
    #[arg(long)]
    base: String,
    #[arg(long)]
    e2b: String,
    #[arg(long, env = "DAIV_SANDBOX_API_KEY", hide_env_values = true)]
    key: String,
    #[arg(long, default_value = "daiv-sandbox-code-interpreter:local")]
    image: String,
    #[arg(long, default_value_t = 50)]
    n: usize,
    #[arg(long, default_value_t = 5)]
    creates: usize,
    /// The service's warm pool of `--image` (`DAIV_SANDBOX_WARM_POOL=IMAGE=N`); 0: none.
    #[arg(long, default_value_t = 0)]
    pool: u64,
}

fn report(name: &str, mut xs: Vec<Duration>) {
    xs.sort();
    let ms = |d: Duration| d.as_secs_f64() * 1000.0;
    let at = |q: f64| {
        xs[((xs.len() as f64 * q).ceil() as usize)
            .saturating_sub(1)
            .min(xs.len() - 1)]
    };
    println!(
        "{name:<24} n={:<4} p50={:>8.2} ms  p90={:>8.2} ms  max={:>8.2} ms",
        xs.len(),
        ms(at(0.5)),
        ms(at(0.9)),
        ms(*xs.last().unwrap_or(&Duration::ZERO))
    );
}

struct Bench {
    http: reqwest::Client,
    args: Args,
}

impl Bench {
    async fn create(&self) -> Result<String> {
        let r = self
            .http
            .post(format!("{}/api/v1/session/", self.args.base))
            .header("X-API-Key", &self.args.key)
            .json(&json!({ "base_image": self.args.image }))
            .send()
            .await?;
        let v: Value = r.json().await?;
        Ok(v["session_id"].as_str().context("session_id")?.to_string())
    }

    async fn remove(&self, id: &str) -> Result<()> {
        self.http
            .delete(format!(
                "{}/api/v1/session/{id}/?force=true",
                self.args.base
            ))
            .header("X-API-Key", &self.args.key)
            .send()
            .await?;
        Ok(())
    }

    async fn native(&self, id: &str) -> Result<Duration> {
        let t = Instant::now();
        let text = self
            .http
            .post(format!("{}/api/v1/session/{id}/code", self.args.base))
            .header("X-API-Key", &self.args.key)
            .json(&json!({ "code": "1+1" }))
            .send()
            .await?
            .text()
            .await?;
        let took = t.elapsed();
        if !text.contains("\"2\"") || !text.contains("end_of_execution") {
            bail!("not 2: {text}");
        }
        Ok(took)
    }

    async fn e2b(&self, id: &str, token: &str) -> Result<Duration> {
        let t = Instant::now();
        let text = self
            .http
            .post(format!("{}/execute", self.args.e2b))
            .header("E2b-Sandbox-Id", id)
            .header("E2b-Sandbox-Port", "49999")
            .header("X-Access-Token", token)
            .json(&json!({ "code": "1+1", "context_id": null, "language": null, "env_vars": null }))
            .send()
            .await?
            .text()
            .await?;
        let took = t.elapsed();
        if !text.contains("\"2\"") {
            bail!("not 2: {text}");
        }
        Ok(took)
    }

    /// An E2B sandbox of the image's template (for its access token).
    async fn e2b_sandbox(&self) -> Result<(String, String)> {
        let v: Value = self
            .http
            .post(format!("{}/sandboxes", self.args.e2b))
            .header("X-API-KEY", &self.args.key)
            .json(&json!({ "templateID": "code-interpreter-v1", "timeout": 600 }))
            .send()
            .await?
            .json()
            .await?;
        Ok((
            v["sandboxID"].as_str().context("sandboxID")?.to_string(),
            v["envdAccessToken"]
                .as_str()
                .unwrap_or_default()
                .to_string(),
        ))
    }

    async fn pool_full(&self) -> Result<()> {
        let deadline = Instant::now() + Duration::from_secs(180);
        let filter = format!("image=\"{}\",kind=\"isolated\"", self.args.image);
        loop {
            let text = self
                .http
                .get(format!("{}/metrics", self.args.base))
                .header("X-API-Key", &self.args.key)
                .send()
                .await?
                .text()
                .await?;
            let size: f64 = text
                .lines()
                .filter(|l| l.starts_with("daiv_sandbox_pool_size{") && l.contains(&filter))
                .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
                .sum();
            if size as u64 >= self.args.pool {
                // A new member's interpreter starts its kernel with it: give it its start.
                tokio::time::sleep(Duration::from_secs(3)).await;
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!("the pool did not refill to {}", self.args.pool);
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

fn docker_exec(id: &str, script: &str) -> Result<String> {
    let container = id.rsplit('.').next().unwrap_or(id);
    let out = std::process::Command::new("docker")
        .args(["exec", "-u", "1000", container, "sh", "-c", script])
        .output()?;
    if !out.status.success() {
        bail!("docker exec: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = <Args as clap::Parser>::parse();
    let http = reqwest::Client::builder()
        .timeout(Duration::from_secs(120))
        .build()?;
    let b = Bench { http, args };
    let n = b.args.n;

    let (id, token) = b.e2b_sandbox().await?;
    b.native(&id).await?; // the default kernel's start, and the warm-up
    // 1. The floor: inside the sandbox, no relay.
    let floor = docker_exec(
        &id,
        &format!(
            "for i in $(seq {}); do curl -s -o /dev/null -w '%{{time_total}}\\n' -X POST \
             -H 'content-type: application/json' --data '{{\"code\":\"1+1\"}}' \
             http://127.0.0.1:49999/execute; done",
            n + 1
        ),
    )?;
    let floor: Vec<Duration> = floor
        .lines()
        .skip(1)
        .filter_map(|l| l.trim().parse::<f64>().ok())
        .map(Duration::from_secs_f64)
        .collect();
    report("in-sandbox floor", floor);
    // 2. Native.
    let mut xs = Vec::new();
    for _ in 0..n {
        xs.push(b.native(&id).await?);
    }
    report("native /code", xs);
    // 3. E2B's wire.
    b.e2b(&id, &token).await?;
    let mut xs = Vec::new();
    for _ in 0..n {
        xs.push(b.e2b(&id, &token).await?);
    }
    report("e2b /execute", xs);
    // 5. Memory of the idle session.
    let ps = docker_exec(
        &id,
        "ps -eo rss=,args= | grep -E 'daiv-code-interpreter|ipykernel' | grep -v grep",
    )?;
    for line in ps.lines() {
        let mut it = line.split_whitespace();
        let rss: u64 = it.next().and_then(|r| r.parse().ok()).unwrap_or(0);
        let what = it.next().unwrap_or("");
        let what = if what.contains("daiv-code-interpreter") {
            "server"
        } else {
            "python kernel"
        };
        println!("{what:<24} rss={:.1} MiB", rss as f64 / 1024.0);
    }
    b.remove(&id).await?;

    // 4. Create + first run.
    let mut xs = Vec::new();
    for _ in 0..b.args.creates {
        if b.args.pool > 0 {
            b.pool_full().await?;
        }
        let t = Instant::now();
        let id = b.create().await?;
        let created = t.elapsed();
        b.native(&id).await?;
        let total = t.elapsed();
        println!(
            "create {:>8.1} ms + first /code {:>8.1} ms",
            created.as_secs_f64() * 1000.0,
            (total - created).as_secs_f64() * 1000.0
        );
        xs.push(total);
        b.remove(&id).await?;
    }
    report(
        if b.args.pool > 0 {
            "create+first (pool)"
        } else {
            "create+first (cold)"
        },
        xs,
    );
    Ok(())
}
