//! Egress gateway benchmark: spawns the real `daiv-egress-gateway` binary against loopback
//! fixture upstreams started in this process, and prints a table and one JSON line.
//!
//! ```text
//! cargo build --release -p egress-gateway -p integration
//! target/release/gateway-bench [--gateway-bin PATH] [--seconds N] [--json-out FILE]
//!                               [--only requests,download,download-h1,download-h2,rss,mint,reload]
//!                               [--rounds N]
//! ```
//!
//! `--only` runs the named sections alone (profiling one of them, comparing two binaries).
//!
//! Measures: req/s and p50/p99 latency (and latency added over a direct connection) for MITM'd,
//! tunnelled and denied small requests at 1 and 64 concurrent keep-alive connections; 50 MiB
//! download throughput direct / MITM / tunnel; gateway RSS idle, under load and after
//! 10 x 50 MiB MITM; leaf mint time cold vs cached (TLS handshake through CONNECT); reload latency.
//! All traffic stays on 127.0.0.1; names under `.test` are mapped by the gateway's static hosts.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use integration::fixtures::{TestCa, rss_of, start_upstream};
use rustls::pki_types::ServerName;
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

const MIB: u64 = 1024 * 1024;
const DOWNLOAD: u64 = 50 * MIB;
const MINT_HOSTS: usize = 40;
/// Rounds of the download comparison, by default.
const DOWNLOAD_ROUNDS: usize = 5;

#[derive(clap::Parser, Debug)]
#[command(about = "The egress gateway alone, against loopback fixture upstreams")]
struct Args {
    /// The gateway binary (default: `daiv-egress-gateway` beside this one).
    #[arg(long)]
    gateway_bin: Option<PathBuf>,
    /// Length of each load section, in seconds.
    #[arg(long, default_value_t = 3.0)]
    seconds: f64,
    /// Also write the JSON report here.
    #[arg(long)]
    json_out: Option<PathBuf>,
    /// Sections to run (comma-separated); none = all.
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    /// Rounds of the download comparison.
    #[arg(long, default_value_t = DOWNLOAD_ROUNDS)]
    rounds: usize,
}

impl Args {
    fn runs(&self, section: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| s == section)
    }

    /// Set by [`args`].
    fn gateway_bin(&self) -> &Path {
        self.gateway_bin
            .as_deref()
            .unwrap_or(Path::new("daiv-egress-gateway"))
    }
}

fn args() -> anyhow::Result<Args> {
    let mut a = <Args as clap::Parser>::parse();
    if a.gateway_bin.is_none() {
        a.gateway_bin = Some(std::env::current_exe()?.with_file_name("daiv-egress-gateway"));
    }
    Ok(a)
}

/// The gateway process; killed on drop.
struct GatewayProc {
    child: Child,
    addr: SocketAddr,
    /// Its health listener.
    health: SocketAddr,
}

impl Drop for GatewayProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl GatewayProc {
    fn rss(&self) -> u64 {
        rss_of(&self.child.id().to_string()).unwrap_or(0)
    }

    /// CPU time the gateway has used so far, in ms.
    fn cpu_ms(&self) -> f64 {
        cpu_ms_of(&self.child.id().to_string())
    }
}

/// CPU time (user + system) of process `pid` (`"self"` for this one) so far, in ms: the sum of
/// its threads' scheduler run time (nanoseconds, `/proc/PID/task/*/schedstat`), which is precise
/// where `/proc/PID/stat` counts 10 ms ticks; falls back to the ticks if schedstat is missing.
fn cpu_ms_of(pid: &str) -> f64 {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
        .flatten();
    let mut ns = 0u64;
    let mut found = false;
    for task in tasks {
        if let Some(run) = std::fs::read_to_string(task.path().join("schedstat"))
            .ok()
            .and_then(|s| {
                s.split_whitespace()
                    .next()
                    .and_then(|v| v.parse::<u64>().ok())
            })
        {
            ns += run;
            found = true;
        }
    }
    if found {
        return ns as f64 / 1e6;
    }
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the ")" of the command name; utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<f64> = rest
        .split_whitespace()
        .filter_map(|x| x.parse().ok())
        .collect();
    (f.get(11).copied().unwrap_or(0.0) + f.get(12).copied().unwrap_or(0.0)) * 10.0
}

struct Env {
    gw: GatewayProc,
    https: SocketAddr,
    http: SocketAddr,
    gateway_ca: TestCa,
    upstream_ca: TestCa,
    policy_path: PathBuf,
    _dir: TempDir,
    _upstreams: (
        integration::fixtures::Upstream,
        integration::fixtures::Upstream,
    ),
}

/// A directory removed on drop (no tempfile dependency in this crate's normal deps).
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn policy(deny_mitm: bool) -> Value {
    let mut rules = vec![
        json!({"host": "tunnel.bench.test"}),
        json!({"host": "*.mint.test", "methods": ["GET"]}),
    ];
    if !deny_mitm {
        rules.insert(0, json!({"host": "mitm.bench.test", "inject": "tok"}));
    } else {
        rules.insert(0, json!({"host": "mitm.bench.test", "methods": ["HEAD"]}));
    }
    json!({
        "policy": {"default": "deny", "intercept": "credentialed", "rules": rules},
        "secrets": {"tok": {"header": "Authorization", "value": "Bearer bench-token"}}
    })
}

fn write_atomic(path: &Path, text: &str) -> anyhow::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text)?;
    std::fs::rename(&tmp, path)?;
    Ok(())
}

async fn setup(args: &Args) -> anyhow::Result<Env> {
    let gateway_ca = TestCa::new("bench gateway ca")?;
    let upstream_ca = TestCa::new("bench upstream ca")?;
    let names = [
        "mitm.bench.test",
        "tunnel.bench.test",
        "upstream.bench.test",
        "*.mint.test",
    ];
    let https_up = start_upstream("bench-https", Some(upstream_ca.server_config(&names)?)).await?;
    let http_up = start_upstream("bench-http", None).await?;
    let dir = std::env::temp_dir().join(format!("gateway-bench-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    let dir = TempDir(dir);
    let p = |n: &str| dir.0.join(n);
    std::fs::write(p("ca.crt"), &gateway_ca.cert_pem)?;
    std::fs::write(p("ca.key"), &gateway_ca.key_pem)?;
    std::fs::write(p("upstream-ca.pem"), &upstream_ca.cert_pem)?;
    let policy_path = p("config.json");
    write_atomic(&policy_path, &policy(false).to_string())?;

    let port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let health_port = std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port();
    let health = SocketAddr::from(([127, 0, 0, 1], health_port));
    let mut statics: Vec<String> = ["mitm.bench.test", "tunnel.bench.test", "denied.bench.test"]
        .iter()
        .map(|n| format!("{n}=127.0.0.1"))
        .collect();
    statics.extend((0..MINT_HOSTS).map(|i| format!("h{i}.mint.test=127.0.0.1")));
    let child = Command::new(args.gateway_bin())
        .arg("--listen")
        .arg(addr.to_string())
        .arg("--health-listen")
        .arg(health.to_string())
        .arg("--policy-file")
        .arg(&policy_path)
        .arg("--ca-cert-file")
        .arg(p("ca.crt"))
        .arg("--ca-key-file")
        .arg(p("ca.key"))
        .arg("--upstream-ca-file")
        .arg(p("upstream-ca.pem"))
        .arg("--allowed-cidrs")
        .arg("127.0.0.0/8")
        .arg("--session-id")
        .arg("bench")
        .arg("--static-host")
        .arg(statics.join(","))
        .env("RUST_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("spawn {}", args.gateway_bin().display()))?;
    let gw = GatewayProc {
        child,
        addr,
        health,
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).await.is_err() {
        if Instant::now() > deadline {
            bail!("gateway did not listen on {addr}");
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    Ok(Env {
        gw,
        https: https_up.addr,
        http: http_up.addr,
        gateway_ca,
        upstream_ca,
        policy_path,
        _dir: dir,
        _upstreams: (https_up, http_up),
    })
}

#[derive(Clone, Copy, PartialEq)]
enum Mode {
    Direct,
    Mitm,
    Tunnel,
    Denied,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Direct => "direct",
            Mode::Mitm => "mitm",
            Mode::Tunnel => "tunnel",
            Mode::Denied => "denied",
        }
    }
}

impl Env {
    fn client(&self, mode: Mode, http1: bool) -> anyhow::Result<reqwest::Client> {
        let cert = |c: &TestCa| reqwest::Certificate::from_der(c.cert_der.as_ref());
        let mut b = reqwest::Client::builder()
            .tls_built_in_root_certs(false)
            .pool_max_idle_per_host(1);
        b = match mode {
            Mode::Direct => b
                .no_proxy()
                .resolve("upstream.bench.test", self.https)
                .add_root_certificate(cert(&self.upstream_ca)?),
            Mode::Mitm => b
                .proxy(reqwest::Proxy::all(format!("http://{}", self.gw.addr))?)
                .add_root_certificate(cert(&self.gateway_ca)?),
            Mode::Tunnel | Mode::Denied => b
                .proxy(reqwest::Proxy::all(format!("http://{}", self.gw.addr))?)
                .add_root_certificate(cert(&self.upstream_ca)?),
        };
        if http1 {
            b = b.http1_only();
        }
        Ok(b.build()?)
    }

    fn url(&self, mode: Mode, path: &str) -> String {
        let port = self.https.port();
        match mode {
            Mode::Direct => format!("https://upstream.bench.test:{port}{path}"),
            Mode::Mitm => format!("https://mitm.bench.test:{port}{path}"),
            Mode::Tunnel => format!("https://tunnel.bench.test:{port}{path}"),
            Mode::Denied => format!("http://denied.bench.test:{}{path}", self.http.port()),
        }
    }
}

struct LoadResult {
    rps: f64,
    p50_ms: f64,
    p99_ms: f64,
    errors: u64,
    peak_rss: u64,
}

async fn load(
    env: &Arc<Env>,
    mode: Mode,
    conns: usize,
    seconds: f64,
) -> anyhow::Result<LoadResult> {
    let expect = if mode == Mode::Denied { 403 } else { 200 };
    let deadline = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    for _ in 0..conns {
        let client = env.client(mode, true)?;
        let url = env.url(mode, "/");
        tasks.push(tokio::spawn(async move {
            // Warm the connection (CONNECT, handshakes) before timing.
            let _ = client.get(&url).send().await.map(|r| r.bytes());
            let (mut lat, mut errors) = (Vec::new(), 0u64);
            while Instant::now() < deadline {
                let t = Instant::now();
                match client.get(&url).send().await {
                    Ok(r) if r.status().as_u16() == expect => {
                        let _ = r.bytes().await;
                        lat.push(t.elapsed());
                    }
                    _ => errors += 1,
                }
            }
            (lat, errors)
        }));
    }
    let started = Instant::now();
    let mut peak_rss = 0;
    while Instant::now() < deadline {
        peak_rss = peak_rss.max(env.gw.rss());
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut all = Vec::new();
    let mut errors = 0;
    for t in tasks {
        let (lat, e) = t.await?;
        all.extend(lat);
        errors += e;
    }
    let elapsed = started.elapsed().as_secs_f64();
    all.sort();
    let pct = |p: f64| {
        all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1)))
            .map_or(0.0, ms)
    };
    Ok(LoadResult {
        rps: all.len() as f64 / elapsed,
        p50_ms: pct(0.50),
        p99_ms: pct(0.99),
        errors,
        peak_rss,
    })
}

/// Resident bytes of `pid` by mapping kind, from `/proc/PID/smaps`: (`[heap]`, other anonymous,
/// file-backed).
fn rss_by_kind(pid: &str) -> (u64, u64, u64) {
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap_or_default();
    let (mut heap, mut anon, mut file) = (0, 0, 0);
    let mut kind = 0;
    for line in smaps.lines() {
        let mut words = line.split_whitespace();
        let first = words.next().unwrap_or_default();
        if first.contains('-') && !first.ends_with(':') {
            // A mapping's header: "start-end perms offset dev inode [path]".
            let path = line.split_whitespace().nth(5).unwrap_or("");
            kind = if path == "[heap]" {
                0
            } else if path.is_empty() || path.starts_with('[') {
                1
            } else {
                2
            };
        } else if first == "Rss:" {
            let kib: u64 = words.next().and_then(|v| v.parse().ok()).unwrap_or(0);
            match kind {
                0 => heap += kib * 1024,
                1 => anon += kib * 1024,
                _ => file += kib * 1024,
            }
        }
    }
    (heap, anon, file)
}

fn ms(d: &Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// One 50 MiB download: (MiB/s, gateway CPU ms, this process's CPU ms: client and upstream).
async fn download(env: &Env, mode: Mode, http1: bool) -> anyhow::Result<(f64, f64, f64)> {
    let client = env.client(mode, http1)?;
    let url = env.url(mode, &format!("/bytes/{DOWNLOAD}"));
    let _ = client.get(env.url(mode, "/")).send().await?.bytes().await?;
    let cpu = env.gw.cpu_ms();
    let own = cpu_ms_of("self");
    let t = Instant::now();
    let mut stream = client.get(&url).send().await?.bytes_stream();
    let mut got = 0u64;
    while let Some(chunk) = stream.next().await {
        got += chunk?.len() as u64;
    }
    if got != DOWNLOAD {
        bail!("{}: short download {got}", mode.name());
    }
    Ok((
        DOWNLOAD as f64 / MIB as f64 / t.elapsed().as_secs_f64(),
        env.gw.cpu_ms() - cpu,
        cpu_ms_of("self") - own,
    ))
}

/// CONNECT + TLS handshake to `host` through the gateway (h1 ALPN): includes minting when cold.
async fn handshake(env: &Env, host: &str) -> anyhow::Result<Duration> {
    let t = Instant::now();
    let mut tcp = TcpStream::connect(env.gw.addr).await?;
    let authority = format!("{host}:{}", env.https.port());
    tcp.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await?;
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        if tcp.read(&mut b).await? == 0 {
            bail!("closed");
        }
        head.push(b[0]);
    }
    let mut roots = rustls::RootCertStore::empty();
    roots.add(env.gateway_ca.cert_der.clone())?;
    let cfg = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()?
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(cfg))
        .connect(ServerName::try_from(host.to_owned())?, tcp)
        .await?;
    let elapsed = t.elapsed();
    drop(tls);
    Ok(elapsed)
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

/// Time from the atomic rename of a new policy until requests see it.
async fn reload_latency(env: &Env) -> anyhow::Result<Vec<f64>> {
    let client = env.client(Mode::Mitm, true)?;
    let url = env.url(Mode::Mitm, "/");
    let mut out = Vec::new();
    for round in 0..6 {
        let deny = round % 2 == 0;
        let want = if deny { 403 } else { 200 };
        tokio::time::sleep(Duration::from_millis(200)).await;
        let t = Instant::now();
        write_atomic(&env.policy_path, &policy(deny).to_string())?;
        loop {
            let status = client.get(&url).send().await?.status().as_u16();
            if status == want {
                break;
            }
            if t.elapsed() > Duration::from_secs(5) {
                bail!("reload not seen within 5 s");
            }
        }
        out.push(ms(&t.elapsed()));
    }
    Ok(out)
}

/// Time from writing a staged policy (in place, as `put_archive` does) until the gateway's health
/// endpoint reports its version: the gateway half of an acknowledged `PUT .../egress/` (the
/// control plane adds one exec round trip). Requests keep flowing meanwhile; any 403 on the
/// host both versions allow is counted as spurious.
async fn staged_install_latency(env: &Env, rounds: usize) -> anyhow::Result<(Vec<f64>, u64)> {
    let health = reqwest::Client::builder().no_proxy().build()?;
    let health_url = format!("http://{}/-/health/", env.gw.health);
    let staged = env.policy_path.with_file_name("config.json.staged");
    let client = env.client(Mode::Mitm, true)?;
    let url = env.url(Mode::Mitm, "/");
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let load = {
        let stop = stop.clone();
        tokio::spawn(async move {
            let mut spurious = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(r) = client.get(&url).send().await
                    && r.status() == 403
                {
                    spurious += 1;
                }
            }
            spurious
        })
    };
    let mut out = Vec::new();
    for round in 0..rounds {
        let mut doc = policy(false);
        let version = format!("bench-{round}");
        doc["version"] = json!(version);
        let t = Instant::now();
        std::fs::write(&staged, doc.to_string())?;
        loop {
            let resp = health.get(&health_url).send().await?;
            let v = resp
                .headers()
                .get("x-egress-policy-version")
                .and_then(|v| v.to_str().ok());
            if v == Some(version.as_str()) {
                break;
            }
            if t.elapsed() > Duration::from_secs(5) {
                bail!("staged policy {version} not enforced within 5 s");
            }
        }
        out.push(ms(&t.elapsed()));
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    Ok((out, load.await?))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = args()?;
    let env = Arc::new(setup(&args).await?);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let rss_idle = env.gw.rss();
    let mut report = json!({"rss_idle_mib": rss_idle as f64 / MIB as f64});

    let mut peak_load_rss = 0;
    if args.runs("requests") {
        println!(
            "{:<8} {:>5} {:>10} {:>9} {:>9} {:>11} {:>7}",
            "mode", "conns", "req/s", "p50 ms", "p99 ms", "added p50", "errors"
        );
        let mut rows = Vec::new();
        for conns in [1usize, 64] {
            let direct = load(&env, Mode::Direct, conns, args.seconds).await?;
            for mode in [Mode::Direct, Mode::Mitm, Mode::Tunnel, Mode::Denied] {
                let r = if mode == Mode::Direct {
                    LoadResult { ..direct }
                } else {
                    load(&env, mode, conns, args.seconds).await?
                };
                let added = if mode == Mode::Denied {
                    f64::NAN
                } else {
                    r.p50_ms - direct.p50_ms
                };
                peak_load_rss = peak_load_rss.max(r.peak_rss);
                println!(
                    "{:<8} {:>5} {:>10.0} {:>9.3} {:>9.3} {:>11.3} {:>7}",
                    mode.name(),
                    conns,
                    r.rps,
                    r.p50_ms,
                    r.p99_ms,
                    added,
                    r.errors
                );
                rows.push(json!({"mode": mode.name(), "conns": conns, "rps": r.rps, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
                                 "added_p50_ms": if added.is_nan() { Value::Null } else { json!(added) }, "errors": r.errors}));
            }
        }
        report["requests"] = json!(rows);
        report["rss_peak_under_load_mib"] = json!(peak_load_rss as f64 / MIB as f64);
    }

    if args.runs("download") || args.runs("download-h1") || args.runs("download-h2") {
        let mut tp = serde_json::Map::new();
        println!(
            "\n50 MiB download ({} rounds of direct, MITM, tunnel back to back; medians, and the median of each round's ratio to its direct run):",
            args.rounds
        );
        for http1 in [false, true] {
            let proto = if http1 { "http1" } else { "h2" };
            let section = if http1 { "download-h1" } else { "download-h2" };
            if !args.runs("download") && !args.runs(section) {
                continue;
            }
            let modes = [Mode::Direct, Mode::Mitm, Mode::Tunnel];
            // Interleaved, so that a load change on the machine hits every mode alike.
            let mut runs = vec![Vec::new(); modes.len()];
            let mut cpu = vec![0.0; modes.len()];
            let mut own = vec![0.0; modes.len()];
            let mut ratios = vec![Vec::new(); modes.len()];
            for _ in 0..args.rounds {
                let mut direct = 0.0;
                for (i, mode) in modes.iter().enumerate() {
                    let (mibs, cpu_ms, own_ms) = download(&env, *mode, http1).await?;
                    if *mode == Mode::Direct {
                        direct = mibs;
                    }
                    runs[i].push(mibs);
                    cpu[i] += cpu_ms;
                    own[i] += own_ms;
                    ratios[i].push(100.0 * mibs / direct);
                }
            }
            let mibs_total = (args.rounds as u64 * DOWNLOAD / MIB) as f64;
            for (i, mode) in modes.iter().enumerate() {
                let (m, pct) = (median(runs[i].clone()), median(ratios[i].clone()));
                let (cpu, own) = (cpu[i] / mibs_total, own[i] / mibs_total);
                let rounded = |v: &[f64]| v.iter().map(|x| x.round()).collect::<Vec<_>>();
                println!(
                    "  {proto:<5} {:<7} {:>8.1} MiB/s  {:>5.1} % of direct  CPU ms/MiB: gateway {:>5.3}, client + upstream {:>5.3}  rounds MiB/s {:?} %: {:?}",
                    mode.name(),
                    m,
                    pct,
                    cpu,
                    own,
                    rounded(&runs[i]),
                    rounded(&ratios[i])
                );
                tp.insert(
                    format!("{proto}_{}", mode.name()),
                    json!({"mib_per_s": m, "pct_of_direct": pct, "gateway_cpu_ms_per_mib": cpu, "client_upstream_cpu_ms_per_mib": own,
                           "rounds_mib_per_s": runs[i], "rounds_pct_of_direct": ratios[i]}),
                );
            }
        }
        report["download_50mib"] = Value::Object(tp);
    }

    if args.runs("rss") {
        let rss_before = env.gw.rss();
        let mut after = Vec::new();
        for _ in 0..10 {
            download(&env, Mode::Mitm, false).await?;
            after.push(env.gw.rss());
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        let rss_settled = env.gw.rss();
        println!(
            "\ngateway RSS: idle {:.1} MiB, peak under load {:.1} MiB, before 10x50 MiB MITM {:.1} MiB, after each {:?} MiB, settled {:.1} MiB",
            rss_idle as f64 / MIB as f64,
            peak_load_rss as f64 / MIB as f64,
            rss_before as f64 / MIB as f64,
            after
                .iter()
                .map(|r| (*r as f64 / MIB as f64 * 10.0).round() / 10.0)
                .collect::<Vec<_>>(),
            rss_settled as f64 / MIB as f64
        );
        report["rss_after_10x50mib_mitm_mib"] = json!(
            after
                .iter()
                .map(|r| *r as f64 / MIB as f64)
                .collect::<Vec<_>>()
        );
        report["rss_settled_mib"] = json!(rss_settled as f64 / MIB as f64);
        let (heap, anon, file) = rss_by_kind(&env.gw.child.id().to_string());
        println!(
            "  of which: malloc heap {:.1} MiB, other anonymous (thread arenas, stacks, large allocations) {:.1} MiB, file-backed (binary, libraries) {:.1} MiB",
            heap as f64 / MIB as f64,
            anon as f64 / MIB as f64,
            file as f64 / MIB as f64
        );
    }

    if args.runs("mint") {
        let mut cold = Vec::new();
        let mut cached = Vec::new();
        for i in 0..MINT_HOSTS {
            cold.push(ms(&handshake(&env, &format!("h{i}.mint.test")).await?));
        }
        for i in 0..MINT_HOSTS {
            cached.push(ms(&handshake(&env, &format!("h{i}.mint.test")).await?));
        }
        let (cold, cached) = (median(cold), median(cached));
        println!(
            "\nCONNECT+TLS handshake via MITM: cold (mints a leaf) {cold:.3} ms, cached {cached:.3} ms, mint ~ {:.3} ms",
            cold - cached
        );
        report["handshake_cold_ms"] = json!(cold);
        report["handshake_cached_ms"] = json!(cached);
        report["mint_ms"] = json!(cold - cached);
    }

    if args.runs("reload") {
        let reload = reload_latency(&env).await?;
        println!(
            "policy reload (rename -> in effect): median {:.1} ms, max {:.1} ms",
            median(reload.clone()),
            reload.iter().cloned().fold(0.0, f64::max)
        );
        report["reload_ms"] = json!(reload);

        let (staged, spurious) = staged_install_latency(&env, 100).await?;
        println!(
            "staged install (write -> health reports the version), 100 updates under load: median {:.1} ms, max {:.1} ms, spurious denials {spurious}",
            median(staged.clone()),
            staged.iter().cloned().fold(0.0, f64::max)
        );
        report["staged_install_ms_median"] = json!(median(staged));
        report["staged_install_spurious_denials"] = json!(spurious);
    }

    let line = report.to_string();
    println!("\nJSON {line}");
    if let Some(path) = args.json_out {
        std::fs::write(path, line + "\n")?;
    }
    Ok(())
}
