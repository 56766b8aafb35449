//! The fleet on real engines: this machine's Docker engine and three Docker-in-Docker engines
//! reached over TCP with mutual TLS (`scripts/fleet-engines.sh`, started by the tests when they
//! are not running). Sessions spread over the engines and work on each; an egress session's
//! gateway lives on its session's engine; a killed engine is routed around, its sessions answer
//! 503 quickly and work again with their files once it is back; a drained engine takes nothing
//! new; the engines file is re-read, a bad one kept out; two replicas with Redis agree; a warm
//! pool spread over engines refills after one dies; nothing is left on any engine.
//!
//! The tests stop and start the shared engines, so they run one at a time (the `fleet` test
//! group). `make test` runs all but the pool's (`#[ignore]`); `make fleet` runs every one.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail, ensure};
use e2e::fleet::{
    EnginesFile, FleetGuard, engine, engine_docker, engine_of, leftovers, local_engine, run_script,
};
use e2e::redis::Redis;
use e2e::{BUSYBOX, ControlPlane, DEBIAN, eventually, require_image};
use reqwest::Method;
use serde_json::{Value, json};

fn b64(text: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(text)
}

/// No request may wait on a dead engine longer than this (the bound).
const DEAD_ENGINE_BOUND: Duration = Duration::from_secs(10);

async fn start(file: &EnginesFile, extra: &[(&str, &str)]) -> Result<ControlPlane> {
    let path = file.path_str();
    let mut env = vec![("ENGINES_FILE", path.as_str())];
    env.extend_from_slice(extra);
    ControlPlane::start_with(&env).await
}

async fn engines(cp: &ControlPlane) -> Result<Vec<Value>> {
    let (s, body) = cp.call(Method::GET, "/engines/", None).await?;
    ensure!(s == 200, "GET /engines/: {s} {body}");
    body["engines"].as_array().cloned().context("no engines")
}

/// `GET /engines/`'s entry for `name`.
async fn engine_state(cp: &ControlPlane, name: &str) -> Result<Option<Value>> {
    Ok(engines(cp).await?.into_iter().find(|e| e["name"] == name))
}

/// Waits until `GET /engines/` says `name` is in `state`.
async fn wait_state(cp: &ControlPlane, name: &str, state: &str, within: Duration) -> Result<()> {
    eventually(&format!("engine {name} {state}"), within, || async {
        Ok(engine_state(cp, name)
            .await?
            .filter(|e| e["state"] == state)
            .map(|_| ()))
    })
    .await
}

/// `POST /session/`, whatever it answers.
async fn try_create(cp: &ControlPlane, body: Value) -> Result<(u16, Value)> {
    cp.call(Method::POST, "/session/", Some(body)).await
}

async fn create(cp: &ControlPlane, body: Value) -> Result<String> {
    let (s, b) = try_create(cp, body).await?;
    ensure!(s == 200, "create: {s} {b}");
    b["session_id"]
        .as_str()
        .map(str::to_string)
        .context("no session_id")
}

async fn sh(cp: &ControlPlane, id: &str, cmd: &str) -> Result<(u16, Value)> {
    cp.call(
        Method::POST,
        &format!("/session/{id}/"),
        Some(json!({ "commands": [cmd] })),
    )
    .await
}

async fn output(cp: &ControlPlane, id: &str, cmd: &str) -> Result<String> {
    let (s, b) = sh(cp, id, cmd).await?;
    ensure!(s == 200, "run on {id}: {s} {b}");
    Ok(b["results"][0]["output"]
        .as_str()
        .unwrap_or_default()
        .to_string())
}

async fn remove(cp: &ControlPlane, id: &str) -> Result<()> {
    let (s, b) = cp
        .call(Method::DELETE, &format!("/session/{id}/?force=true"), None)
        .await?;
    ensure!(s == 204, "delete {id}: {s} {b}");
    Ok(())
}

fn assert_clean(engines: &[&str], deployment: &str) -> Result<()> {
    for name in engines {
        let left = leftovers(name, deployment)?;
        ensure!(left.is_empty(), "left on engine {name}: {left:?}");
    }
    Ok(())
}

#[tokio::test]
async fn sessions_spread_over_engines_work_on_each_and_leave_nothing() -> Result<()> {
    require_image(BUSYBOX);
    let all = e2e::fleet::up()?;
    let file = EnginesFile::new(&[
        local_engine(json!({"max_sessions": 2})),
        engine(&all, "a", json!({})),
        engine(&all, "b", json!({})),
        engine(&all, "c", json!({})),
    ])?;
    let cp = start(&file, &[]).await?;
    let _guard = FleetGuard::new(&cp.deployment, &["local", "a", "b", "c"]);
    for name in ["local", "a", "b", "c"] {
        wait_state(&cp, name, "up", Duration::from_secs(15)).await?;
    }

    let mut ids = Vec::new();
    for _ in 0..8 {
        ids.push(create(&cp, json!({"base_image": BUSYBOX})).await?);
    }
    let used: BTreeSet<&str> = ids.iter().map(|id| engine_of(id)).collect();
    ensure!(used.len() >= 2, "8 sessions all on {used:?}");
    // The local engine's cap holds.
    let on_local = ids.iter().filter(|id| engine_of(id) == "local").count();
    ensure!(
        on_local <= 2,
        "{on_local} sessions on the local engine (max 2)"
    );

    // Every session works where it is, and its container is on the engine its id names.
    for id in &ids {
        let out = output(&cp, id, "echo hello > f && cat f && hostname").await?;
        let (name, raw) = (engine_of(id), id.rsplit('.').next().unwrap_or(id));
        ensure!(out.starts_with("hello\n"), "{id}: {out:?}");
        ensure!(out.contains(&raw[..12]), "{id} answered from {out:?}");
        let running = engine_docker(name, &["inspect", "-f", "{{.State.Running}}", raw])?;
        ensure!(running == "true", "{id} on engine {name}: {running}");
    }

    // Files, streaming and background processes on a remote session.
    let remote = ids
        .iter()
        .find(|id| engine_of(id) != "local")
        .context("no remote session")?
        .clone();
    let (s, b) = cp
        .call(
            Method::POST,
            &format!("/session/{remote}/fs/write/"),
            Some(json!({"path": "/workspace/repo/notes.txt", "content": b64("on a remote engine\n")})),
        )
        .await?;
    ensure!(s == 200 || s == 204, "fs write: {s} {b}");
    let (s, b) = cp
        .call(
            Method::POST,
            &format!("/session/{remote}/fs/read/"),
            Some(json!({"path": "/workspace/repo/notes.txt"})),
        )
        .await?;
    let text = b.to_string();
    ensure!(
        s == 200
            && (text.contains("on a remote engine") || text.contains(&b64("on a remote engine\n"))),
        "fs read: {s} {b}"
    );
    let streamed = cp
        .request(Method::POST, &format!("/session/{remote}/"))
        .header("Accept", "application/x-ndjson")
        .json(&json!({"commands": ["echo one; echo two"]}))
        .send()
        .await?
        .text()
        .await?;
    ensure!(
        streamed.contains("one") && streamed.contains("\"done\""),
        "{streamed}"
    );
    let (s, b) = cp
        .call(
            Method::POST,
            &format!("/session/{remote}/processes/"),
            Some(json!({"command": "echo background"})),
        )
        .await?;
    ensure!(s == 201, "process: {s} {b}");

    // The engines' counts and the metrics carry the engine names.
    eventually(
        "sessions counted per engine",
        Duration::from_secs(10),
        || async {
            let total: u64 = engines(&cp)
                .await?
                .iter()
                .filter_map(|e| e["sessions"].as_u64())
                .sum();
            Ok((total >= 8).then_some(()))
        },
    )
    .await?;
    let metrics = cp.metrics().await?;
    let remote_engine = engine_of(&remote);
    ensure!(
        metrics.contains(&format!(
            "daiv_sandbox_engine_call_duration_seconds_count{{op=\"create\",engine=\"{remote_engine}\"}}"
        )),
        "no create on {remote_engine} in the metrics"
    );
    ensure!(metrics.contains(&format!(
        "daiv_sandbox_engine_up{{engine=\"{remote_engine}\"}} 1"
    )));
    let listed = engines(&cp).await?.to_vec();
    let text = serde_json::to_string(&listed)?;
    ensure!(
        !text.contains("tcp://") && !text.contains(".pem"),
        "GET /engines/ shows endpoints or TLS files: {text}"
    );

    for id in &ids {
        remove(&cp, id).await?;
    }
    assert_clean(&["local", "a", "b", "c"], &cp.deployment)
}

/// A service whose only engine is the fleet's engine b, with egress on: an upstream inside
/// engine b under made-up names, its CA trusted by the gateway.
struct EgressOnB {
    // Dropped in this order (as the fields are declared): what the deployment left on engine b,
    // the service, its engines file, the settings' files, the upstream.
    _guard: FleetGuard,
    cp: ControlPlane,
    _file: EnginesFile,
    _dir: tempfile::TempDir,
    up: RemoteUpstream,
}

impl EgressOnB {
    async fn start() -> Result<Self> {
        require_image(DEBIAN);
        let all = e2e::fleet::up()?;
        // The upstream runs inside engine b, on a network of its own there, under made-up names.
        let up = RemoteUpstream::start("b")?;
        // Removed when the test ends, however it ends.
        let dir = tempfile::Builder::new()
            .prefix("daiv-e2e-fleet-egress-")
            .tempdir()?;
        let settings = e2e::egress::EgressSettings::on_network(dir.path(), &up.network)?
            .with_upstream(dir.path(), &up.ca.cert_pem, &up.subnet)?;
        let file = EnginesFile::new(&[engine(&all, "b", json!({}))])?;
        let cp = start(&file, &settings.env(&[])).await?;
        let guard = FleetGuard::new(&cp.deployment, &["b"]);
        wait_state(&cp, "b", "up", Duration::from_secs(15)).await?;
        Ok(Self {
            _guard: guard,
            cp,
            _file: file,
            _dir: dir,
            up,
        })
    }

    /// A Debian session on engine b whose egress allows `GET api.upstream.test`, injecting a
    /// secret.
    async fn session(&self) -> Result<String> {
        let id = create(
            &self.cp,
            json!({
                "base_image": DEBIAN,
                "egress": {"policy": {"default": "deny", "intercept": "all", "rules": [
                    {"host": "api.upstream.test", "methods": ["GET"], "inject": "tok"}
                ]}, "secrets": {"tok": {"header": "Authorization", "value": "Bearer s3cret-fleet"}}}
            }),
        )
        .await?;
        ensure!(engine_of(&id) == "b", "{id}");
        Ok(id)
    }
}

/// Issue 35 through the fleet, with egress on: on a session of engine b, a file of
/// `FLEET_FILE_MIB` MiB (64 unless set) up and down with the service's memory sampled and
/// compared byte for byte, a process's stdout and stderr apart, a watch seeing a thousand
/// creates, and a real terminal (bash, `stty size`, `top`, `vi`) over the WebSocket; the
/// session's egress in force throughout.
#[tokio::test]
async fn the_data_plane_works_on_a_remote_engine_with_egress_on() -> Result<()> {
    use e2e::dataplane;
    let fleet = EgressOnB::start().await?;
    let (cp, up) = (&fleet.cp, &fleet.up);
    let id = fleet.session().await?;
    let mib = std::env::var("FLEET_FILE_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let t = dataplane::round_trip(cp, &id, "/home/sandbox/big.bin", mib).await?;
    println!("{mib} MiB through engine b: {t:?}");
    ensure!(t.up_peak_kib < t.before_kib + 128 * 1024, "upload: {t:?}");
    ensure!(
        t.down_peak_kib < t.before_kib + 128 * 1024,
        "download: {t:?}"
    );
    dataplane::a_process_keeps_its_streams_apart(cp, &id, "two").await?;
    dataplane::a_watch_sees_a_thousand_creates(cp, &id, "/tmp/w").await?;
    dataplane::a_terminal_over_a_websocket(cp, &id, false).await?;
    // Ingress on a remote engine: a server in the session reached through the service.
    let (s, v) = cp
        .call(
            Method::POST,
            &format!("/session/{id}/processes/"),
            Some(
                json!({"command": "mkdir -p /tmp/site && echo fleet-page > /tmp/site/index.html \
                && exec python3 -m http.server 8777 --bind 127.0.0.1 --directory /tmp/site"}),
            ),
        )
        .await?;
    ensure!(s == 201, "{v}");
    let page = eventually(
        "the server answers through engine b",
        Duration::from_secs(30),
        || async {
            let r = cp
                .request(Method::GET, &format!("/session/{id}/ports/8777/"))
                .send()
                .await?;
            Ok(if r.status() == 200 {
                Some(r.text().await?)
            } else {
                None
            })
        },
    )
    .await?;
    ensure!(page.contains("fleet-page"), "{page}");
    // Egress in force: the allowed host answers with the secret injected, another is refused.
    let out = output(
        cp,
        &id,
        "curl -sS --fail https://api.upstream.test/dataplane && \
         ! curl -sS --fail https://other.upstream.test/denied 2>/dev/null && echo refused",
    )
    .await?;
    ensure!(out.trim_end().ends_with("refused"), "{out}");
    let seen = up.requests()?;
    ensure!(
        seen.iter()
            .any(|r| r["path"] == "/dataplane"
                && r["headers"]["authorization"] == "Bearer s3cret-fleet"),
        "{seen:?}"
    );
    remove(cp, &id).await?;
    assert_clean(&["b"], &cp.deployment)
}

#[tokio::test]
async fn an_egress_session_on_a_remote_engine_has_its_gateway_there() -> Result<()> {
    let fleet = EgressOnB::start().await?;
    let (cp, up) = (&fleet.cp, &fleet.up);
    let id = fleet.session().await?;
    let raw = id.rsplit('.').next().unwrap_or(&id);
    let token = engine_docker(
        "b",
        &[
            "inspect",
            "-f",
            "{{index .Config.Labels \"daiv.sandbox.egress\"}}",
            raw,
        ],
    )?;
    let gateway = engine_docker(
        "b",
        &[
            "ps",
            "-q",
            "--filter",
            &format!("label=daiv.sandbox.egress={token}"),
            "--filter",
            "label=daiv.sandbox.role=egress-gateway",
        ],
    )?;
    ensure!(!gateway.is_empty(), "no gateway on engine b for {token}");
    let (s, b) = cp
        .call(
            Method::POST,
            &format!("/session/{id}/"),
            Some(json!({"commands": [
                "curl -sS --fail https://api.upstream.test/allowed",
                "curl -sS --fail https://other.upstream.test/denied"
            ]})),
        )
        .await?;
    ensure!(s == 200, "{s} {b}");
    ensure!(b["results"][0]["exit_code"] == 0, "allowed: {b}");
    ensure!(b["results"][1]["exit_code"] != 0, "denied: {b}");
    let seen = up.requests()?;
    let auth = seen
        .iter()
        .find(|r| r["path"] == "/allowed")
        .and_then(|r| r["headers"]["authorization"].as_str())
        .unwrap_or_default()
        .to_string();
    ensure!(auth == "Bearer s3cret-fleet", "upstream saw {auth:?}");
    let (_, env) = sh(
        cp,
        &id,
        "env; cat /proc/1/environ 2>/dev/null | tr '\\0' '\\n'",
    )
    .await?;
    ensure!(
        !env.to_string().contains("s3cret-fleet"),
        "the secret reached the sandbox"
    );

    remove(cp, &id).await?;
    assert_clean(&["b"], &cp.deployment)
}

#[tokio::test]
async fn a_dead_engine_is_routed_around_and_its_sessions_come_back_with_their_files() -> Result<()>
{
    require_image(BUSYBOX);
    let all = e2e::fleet::up()?;
    // `a` drained: every new session goes to `b`.
    let file = EnginesFile::new(&[
        engine(&all, "a", json!({"drain": true})),
        engine(&all, "b", json!({})),
    ])?;
    let cp = start(&file, &[]).await?;
    let _guard = FleetGuard::new(&cp.deployment, &["a", "b"]);
    wait_state(&cp, "a", "draining", Duration::from_secs(15)).await?;
    wait_state(&cp, "b", "up", Duration::from_secs(15)).await?;
    let mut on_b = Vec::new();
    for _ in 0..3 {
        let id = create(&cp, json!({"base_image": BUSYBOX})).await?;
        ensure!(engine_of(&id) == "b", "a drained engine took {id}");
        on_b.push(id);
    }
    let kept = on_b[0].clone();
    ensure!(output(&cp, &kept, "echo kept > /workspace/repo/kept && echo ok").await? == "ok\n");

    // Undrained by a new file, no restart.
    file.write(&[engine(&all, "a", json!({})), engine(&all, "b", json!({}))])?;
    wait_state(&cp, "a", "up", Duration::from_secs(10)).await?;

    // A command in flight when b dies: its fate is unknown, so it is a 503, never a result.
    let busy = on_b[1].clone();
    let in_flight = {
        let req = cp
            .request(Method::POST, &format!("/session/{busy}/"))
            .json(&json!({"commands": ["sleep 30"]}));
        tokio::spawn(async move {
            let r = req.send().await?;
            let status = r.status().as_u16();
            anyhow::Ok((status, r.text().await?))
        })
    };
    tokio::time::sleep(Duration::from_secs(1)).await;

    // Kill b: it is noticed within seconds, its sessions answer 503 and no request waits long.
    run_script(&["kill", "b"], None)?;
    let killed = Instant::now();
    let mut slowest = Duration::ZERO;
    let mut last = 0;
    while killed.elapsed() < Duration::from_secs(8) {
        let asked = Instant::now();
        let (s, b) = sh(&cp, &kept, "cat /workspace/repo/kept").await?;
        slowest = slowest.max(asked.elapsed());
        ensure!(s == 503, "a session of a dead engine answered {s} {b}");
        last = s;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    ensure!(last == 503);
    ensure!(
        slowest < DEAD_ENGINE_BOUND,
        "a request waited {slowest:?} on a dead engine"
    );
    wait_state(&cp, "b", "down", Duration::from_secs(1)).await?;
    let (status, body) = in_flight.await??;
    ensure!(
        status == 503,
        "a command cut by its engine's death answered {status} {body}"
    );
    // The session's status, its fs ops and its deletion answer 503 too, at once.
    let asked = Instant::now();
    let (s, _) = cp
        .call(Method::GET, &format!("/session/{kept}/"), None)
        .await?;
    ensure!(s == 503 && asked.elapsed() < Duration::from_secs(1), "{s}");

    // New sessions go elsewhere.
    let mut on_a = Vec::new();
    for _ in 0..2 {
        let id = create(&cp, json!({"base_image": BUSYBOX})).await?;
        ensure!(engine_of(&id) == "a", "placed {id} with b dead");
        on_a.push(id);
    }

    // b comes back: its sessions work again, with their files.
    run_script(&["start", "b"], None)?;
    wait_state(&cp, "b", "up", Duration::from_secs(15)).await?;
    let out = output(&cp, &kept, "cat /workspace/repo/kept").await?;
    ensure!(out == "kept\n", "after the engine's restart: {out:?}");

    for id in on_a.iter().chain(&on_b) {
        remove(&cp, id).await?;
    }
    assert_clean(&["a", "b"], &cp.deployment)
}

#[tokio::test]
async fn the_engines_file_is_reread_a_bad_one_is_kept_out_and_unknown_engines_are_404() -> Result<()>
{
    require_image(BUSYBOX);
    let all = e2e::fleet::up()?;
    let file = EnginesFile::new(&[engine(&all, "a", json!({"max_sessions": 1}))])?;
    let cp = start(&file, &[]).await?;
    let _guard = FleetGuard::new(&cp.deployment, &["a", "b"]);
    wait_state(&cp, "a", "up", Duration::from_secs(15)).await?;

    // Ids naming no configured engine, or none at all without a default engine: 404.
    let raw = "0123456789abcdef".repeat(4);
    for id in [format!("zz.{raw}"), raw.clone(), format!("b.{raw}")] {
        let (s, b) = cp
            .call(Method::GET, &format!("/session/{id}/"), None)
            .await?;
        ensure!(s == 404, "{id}: {s} {b}");
    }

    // One session fills `a`: the next is refused with a clear 503.
    let first = create(&cp, json!({"base_image": BUSYBOX})).await?;
    ensure!(engine_of(&first) == "a");
    eventually("a counted full", Duration::from_secs(5), || async {
        let e = engine_state(&cp, "a").await?.context("no a")?;
        Ok((e["sessions"] == 1).then_some(()))
    })
    .await?;
    let (s, b) = try_create(&cp, json!({"base_image": BUSYBOX})).await?;
    ensure!(s == 503, "{s} {b}");
    let detail = b["detail"].as_str().unwrap_or_default();
    ensure!(
        detail.contains("a is at capacity (1/1 sessions)"),
        "{detail}"
    );

    // A bad file changes nothing, and says so on /metrics.
    file.write_raw(b"{\"engines\": [{\"name\": \"a\", \"endpoint\": \"nowhere\"}]}")?;
    eventually("the bad file noticed", Duration::from_secs(10), || async {
        Ok(cp
            .metrics()
            .await?
            .contains("daiv_sandbox_engines_file_valid 0")
            .then_some(()))
    })
    .await?;
    ensure!(engines(&cp).await?.len() == 1);
    ensure!(cp.logs().contains("engines file refused"));

    // b listed with a CA that did not sign its certificate: never trusted, never up.
    let impostor = e2e::egress::TestCa::new("not the fleet's CA")?;
    let dir = tempfile::Builder::new()
        .prefix("daiv-e2e-fleet-ca-")
        .tempdir()?;
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, &impostor.cert_pem)?;
    let mut tls = engine(&all, "b", json!({}))["tls"].clone();
    tls["ca"] = json!(ca.display().to_string());
    file.write(&[
        engine(&all, "a", json!({"max_sessions": 1})),
        engine(&all, "b", json!({ "tls": tls })),
    ])?;
    eventually("b listed", Duration::from_secs(10), || async {
        Ok(engine_state(&cp, "b").await?.map(|_| ()))
    })
    .await?;
    // Several health checks later, it is still down, and takes nothing.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let state = engine_state(&cp, "b").await?.context("no b")?;
    ensure!(state["state"] == "down", "{state}");
    let (s, b) = try_create(&cp, json!({"base_image": BUSYBOX})).await?;
    let detail = b["detail"].as_str().unwrap_or_default();
    ensure!(s == 503 && detail.contains("b is down"), "{s} {detail}");

    // Adding b: new sessions go there with no restart, and the file is valid again.
    file.write(&[
        engine(&all, "a", json!({"max_sessions": 1})),
        engine(&all, "b", json!({})),
    ])?;
    wait_state(&cp, "b", "up", Duration::from_secs(15)).await?;
    let second = create(&cp, json!({"base_image": BUSYBOX})).await?;
    ensure!(engine_of(&second) == "b", "{second}");
    ensure!(
        cp.metrics()
            .await?
            .contains("daiv_sandbox_engines_file_valid 1")
    );

    // Removing b from the file: its sessions are not found (until it is listed again).
    file.write(&[engine(&all, "a", json!({"max_sessions": 1}))])?;
    eventually("b removed", Duration::from_secs(10), || async {
        Ok(engine_state(&cp, "b").await?.is_none().then_some(()))
    })
    .await?;
    let (s, _) = cp
        .call(Method::GET, &format!("/session/{second}/"), None)
        .await?;
    ensure!(s == 404, "{s}");
    file.write(&[
        engine(&all, "a", json!({"max_sessions": 1})),
        engine(&all, "b", json!({})),
    ])?;
    wait_state(&cp, "b", "up", Duration::from_secs(15)).await?;
    remove(&cp, &second).await?;
    remove(&cp, &first).await?;
    assert_clean(&["a", "b"], &cp.deployment)
}

#[tokio::test]
async fn two_replicas_with_redis_agree_on_engines_and_sessions() -> Result<()> {
    require_image(BUSYBOX);
    let all = e2e::fleet::up()?;
    let redis = Redis::start()?;
    let file = EnginesFile::new(&[engine(&all, "b", json!({})), engine(&all, "c", json!({}))])?;
    let url = redis.url();
    let deployment = format!("e2e-fleet-{}-{}", std::process::id(), e2e::free_port());
    let env = [
        ("REDIS_URL", url.as_str()),
        ("DEPLOYMENT", deployment.as_str()),
    ];
    let one = start(&file, &env).await?;
    let two = start(&file, &env).await?;
    let _guard = FleetGuard::new(&deployment, &["b", "c"]);
    for cp in [&one, &two] {
        wait_state(cp, "b", "up", Duration::from_secs(15)).await?;
        wait_state(cp, "c", "up", Duration::from_secs(15)).await?;
    }
    let mut ids = Vec::new();
    for i in 0..4 {
        let cp = if i % 2 == 0 { &one } else { &two };
        ids.push(create(cp, json!({"base_image": BUSYBOX})).await?);
    }
    // Each replica serves every session, wherever it is and whoever made it.
    for id in &ids {
        for cp in [&one, &two] {
            let out = output(cp, id, "echo $((6*7))").await?;
            ensure!(out == "42\n", "{id}: {out:?}");
        }
    }
    // Both see the same engines and, once counted, the same sessions.
    eventually("replicas agree", Duration::from_secs(10), || async {
        let (a, b) = (engines(&one).await?, engines(&two).await?);
        Ok(
            (a == b && a.iter().filter_map(|e| e["sessions"].as_u64()).sum::<u64>() == 4)
                .then_some(()),
        )
    })
    .await?;
    // A drain written once is seen by both.
    file.write(&[
        engine(&all, "b", json!({"drain": true})),
        engine(&all, "c", json!({})),
    ])?;
    for cp in [&one, &two] {
        wait_state(cp, "b", "draining", Duration::from_secs(10)).await?;
        let id = create(cp, json!({"base_image": BUSYBOX})).await?;
        ensure!(engine_of(&id) == "c", "a drained engine took {id}");
        ids.push(id);
    }
    for id in &ids {
        remove(&one, id).await?;
    }
    assert_clean(&["b", "c"], &deployment)
}

#[tokio::test]
async fn only_engines_with_the_runtime_take_its_sessions() -> Result<()> {
    require_image(BUSYBOX);
    let all = e2e::fleet::up()?;
    // gVisor is registered on this machine's engine only (the DinD engines have runc).
    let file = EnginesFile::new(&[
        local_engine(json!({})),
        engine(&all, "a", json!({})),
        engine(&all, "b", json!({})),
    ])?;
    let cp = start(&file, &[("RUNTIME", "runsc")]).await?;
    let _guard = FleetGuard::new(&cp.deployment, &["local", "a", "b"]);
    for name in ["local", "a", "b"] {
        wait_state(&cp, name, "up", Duration::from_secs(15)).await?;
    }
    let mut ids = Vec::new();
    for _ in 0..3 {
        let id = create(&cp, json!({"base_image": BUSYBOX})).await?;
        ensure!(engine_of(&id) == "local", "a runsc session on {id}");
        ids.push(id);
    }
    ensure!(
        output(&cp, &ids[0], "dmesg 2>/dev/null | head -1; echo ok")
            .await?
            .contains("ok")
    );
    // Without the local engine, nothing can take one: a clear 503.
    file.write(&[engine(&all, "a", json!({})), engine(&all, "b", json!({}))])?;
    eventually("local removed", Duration::from_secs(10), || async {
        Ok(engine_state(&cp, "local").await?.is_none().then_some(()))
    })
    .await?;
    let (s, b) = try_create(&cp, json!({"base_image": BUSYBOX})).await?;
    let detail = b["detail"].as_str().unwrap_or_default();
    ensure!(
        s == 503 && detail.contains("a has no runsc runtime"),
        "{s} {b}"
    );
    file.write(&[
        local_engine(json!({})),
        engine(&all, "a", json!({})),
        engine(&all, "b", json!({})),
    ])?;
    wait_state(&cp, "local", "up", Duration::from_secs(15)).await?;
    for id in &ids {
        remove(&cp, id).await?;
    }
    assert_clean(&["local", "a", "b"], &cp.deployment)
}

/// Ready warm-pool members of `deployment` on engine `name`.
fn members(name: &str, deployment: &str) -> Result<usize> {
    let out = engine_docker(
        name,
        &[
            "ps",
            "--filter",
            &format!("label=daiv.sandbox.deployment={deployment}"),
            "--filter",
            "label=daiv.sandbox.pool=isolated",
            "--format",
            "{{.Names}}",
        ],
    )?;
    Ok(out.lines().filter(|n| n.starts_with("daiv-pool-")).count())
}

#[tokio::test]
async fn a_pool_spread_over_engines_refills_after_one_dies() -> Result<()> {
    require_image(BUSYBOX);
    let all = e2e::fleet::up()?;
    let file = EnginesFile::new(&[engine(&all, "a", json!({})), engine(&all, "b", json!({}))])?;
    let pool = format!("{BUSYBOX}=4");
    let cp = start(&file, &[("WARM_POOL", pool.as_str())]).await?;
    let _guard = FleetGuard::new(&cp.deployment, &["a", "b"]);
    let d = cp.deployment.clone();
    eventually(
        "4 members over a and b",
        Duration::from_secs(120),
        || async {
            let (a, b) = (members("a", &d)?, members("b", &d)?);
            Ok((a + b == 4 && a > 0 && b > 0).then_some(()))
        },
    )
    .await?;
    // A claim comes from the pool, wherever the member is.
    let claimed = create(&cp, json!({"base_image": BUSYBOX})).await?;
    ensure!(output(&cp, &claimed, "echo warm").await? == "warm\n");
    remove(&cp, &claimed).await?;

    run_script(&["kill", "a"], None)?;
    eventually(
        "the pool refilled on b",
        Duration::from_secs(120),
        || async { Ok((members("b", &d)? == 4).then_some(())) },
    )
    .await?;
    let id = create(&cp, json!({"base_image": BUSYBOX})).await?;
    ensure!(engine_of(&id) == "b", "{id}");
    remove(&cp, &id).await?;

    // a back: the pool is spread again (its old members adopted or replaced).
    run_script(&["start", "a"], None)?;
    wait_state(&cp, "a", "up", Duration::from_secs(15)).await?;
    eventually(
        "4 members over a and b again",
        Duration::from_secs(120),
        || async {
            let (a, b) = (members("a", &d)?, members("b", &d)?);
            Ok((a + b == 4 && a > 0).then_some(()))
        },
    )
    .await?;
    drop(cp);
    Ok(())
}

/// The HTTPS echo upstream inside fleet engine `engine`, on a network of its own there.
struct RemoteUpstream {
    engine: String,
    network: String,
    subnet: String,
    container: String,
    ca: e2e::egress::TestCa,
}

impl RemoteUpstream {
    fn start(engine: &str) -> Result<Self> {
        let tag = format!("{}-{}", std::process::id(), e2e::free_port());
        let network = format!("daiv-e2e-upstream-{tag}");
        let subnet = "198.19.77.0/24".to_string();
        let _ = engine_docker(engine, &["network", "rm", &network]);
        engine_docker(
            engine,
            &["network", "create", "--subnet", &subnet, &network],
        )?;
        let ca = e2e::egress::TestCa::new("daiv e2e upstream CA")?;
        let (cert, key) = ca.leaf_pem(e2e::egress::UPSTREAM_NAMES)?;
        let tmp = tempfile::Builder::new()
            .prefix("daiv-e2e-remote-upstream-")
            .tempdir()?;
        let dir = tmp.path();
        std::fs::write(dir.join("server.crt"), cert)?;
        std::fs::write(dir.join("server.key"), key)?;
        std::fs::write(dir.join("server.py"), e2e::egress::ECHO_SERVER)?;
        let mut args = vec!["create", "--network", &network, "--label", "daiv.e2e=1"];
        for name in e2e::egress::UPSTREAM_NAMES {
            args.extend(["--network-alias", name]);
        }
        args.extend([DEBIAN, "python3", "/certs/server.py"]);
        let container = engine_docker(engine, &args)?;
        let dir_arg = format!("{}/.", dir.display());
        let target = format!("{container}:/certs");
        engine_docker(engine, &["cp", &dir_arg, &target])?;
        engine_docker(engine, &["start", &container])?;
        drop(tmp);
        let up = Self {
            engine: engine.to_string(),
            network,
            subnet,
            container,
            ca,
        };
        for _ in 0..100 {
            if engine_docker(engine, &["exec", &up.container, "test", "-f", "/tmp/ready"]).is_ok() {
                return Ok(up);
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        bail!("the remote upstream did not start")
    }

    fn requests(&self) -> Result<Vec<Value>> {
        let out = engine_docker(
            &self.engine,
            &[
                "exec",
                &self.container,
                "sh",
                "-c",
                "cat /tmp/requests.jsonl 2>/dev/null || true",
            ],
        )?;
        out.lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| serde_json::from_str(l).context("request record"))
            .collect()
    }
}

impl Drop for RemoteUpstream {
    fn drop(&mut self) {
        let _ = engine_docker(&self.engine, &["rm", "-fv", &self.container]);
        let _ = engine_docker(&self.engine, &["network", "rm", &self.network]);
    }
}

/// `POST /session/{id}/{what}/` (a snapshot or a fork), insisting on 201.
async fn post_201(cp: &ControlPlane, id: &str, what: &str, body: Value) -> Result<Value> {
    let (s, b) = cp
        .call(Method::POST, &format!("/session/{id}/{what}/"), Some(body))
        .await?;
    ensure!(s == 201, "{what} of {id}: {s} {b}");
    Ok(b)
}

/// Snapshots and forks on a remote engine: the engine's probe says its overlays mount, its
/// sessions from a snapshot and its forks stay on it as layers over the snapshot's (a file
/// deleted stays deleted in a fork of a fork), and deleting every snapshot and session leaves
/// nothing on it.
#[tokio::test]
async fn forks_of_forks_on_a_remote_engine_are_layers_there_and_leave_nothing() -> Result<()> {
    require_image(BUSYBOX);
    let all = e2e::fleet::up()?;
    let file = EnginesFile::new(&[engine(&all, "a", json!({}))])?;
    let cp = start(
        &file,
        &[
            ("REAPER_ENABLED", "true"),
            ("REAPER_INTERVAL_SECONDS", "1"),
            ("SESSION_GRACE_SECONDS", "1"),
        ],
    )
    .await?;
    let _guard = FleetGuard::new(&cp.deployment, &["a"]);
    wait_state(&cp, "a", "up", Duration::from_secs(15)).await?;

    let first = create(&cp, json!({"base_image": BUSYBOX})).await?;
    ensure!(engine_of(&first) == "a", "{first}");
    output(
        &cp,
        &first,
        "cd /workspace && echo gone > gone && echo kept > kept",
    )
    .await?;
    let snap = post_201(&cp, &first, "snapshot", json!({})).await?;
    let snap = snap["snapshot_id"].as_str().context("snapshot_id")?;
    ensure!(snap.starts_with("a."), "{snap}");
    let second = create(&cp, json!({"snapshot_id": snap})).await?;
    ensure!(engine_of(&second) == "a", "{second}");
    output(&cp, &second, "cd /workspace && rm gone && echo two > two").await?;
    let mut at = second.clone();
    let mut forks = Vec::new();
    for _ in 0..2 {
        let b = post_201(&cp, &at, "fork", json!({"count": 1})).await?;
        let next = b["session_ids"][0].as_str().context("a fork")?.to_string();
        ensure!(engine_of(&next) == "a", "a fork left its engine: {next}");
        forks.push(std::mem::replace(&mut at, next));
    }
    let seen = output(
        &cp,
        &at,
        "cd /workspace && { test -e gone && echo back || echo deleted; }; cat kept two",
    )
    .await?;
    ensure!(seen == "deleted\nkept\ntwo\n", "{seen:?}");
    let a = engine_state(&cp, "a").await?.context("engine a")?;
    ensure!(a["snapshot_layers"]["mode"] == "overlay", "{a}");
    // The forks' snapshots are layers over the one below, on the engine's own volumes.
    let layered = engine_docker(
        "a",
        &[
            "volume",
            "ls",
            "-q",
            "--filter",
            &format!("label=daiv.sandbox.deployment={}", cp.deployment),
            "--filter",
            "label=daiv.sandbox.role=snapshot-data",
        ],
    )?
    .lines()
    .filter(|v| {
        engine_docker(
            "a",
            &["volume", "inspect", "--format", "{{json .Labels}}", v],
        )
        .is_ok_and(|l| l.contains("daiv.sandbox.snapshot.lowers"))
    })
    .count();
    ensure!(layered >= 2, "{layered} layered snapshots on engine a");

    let (s, b) = cp
        .call(Method::DELETE, &format!("/snapshots/{snap}/"), None)
        .await?;
    ensure!(s == 204, "delete the snapshot: {s} {b}");
    for id in [&first, &second, &at].into_iter().chain(&forks[1..]) {
        remove(&cp, id).await?;
    }
    // The layer worker goes once idle for a minute (see `snapshots::worker`).
    eventually("nothing left on a", Duration::from_secs(120), || async {
        Ok(leftovers("a", &cp.deployment)?.is_empty().then_some(()))
    })
    .await?;
    Ok(())
}
