//! Streaming runs, background processes and operations that overlap a running command, against
//! the real binary on real Docker (both images; the lifecycle also under gVisor).

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::{BUSYBOX, ControlPlane, DEBIAN, Session, eventually, require_image};
use futures::StreamExt;
use reqwest::Method;
use serde_json::{Value, json};

/// Posts a run with `Accept: application/x-ndjson`; returns the response (not yet read).
async fn stream(cp: &ControlPlane, s: &Session, body: Value) -> Result<reqwest::Response> {
    let resp = cp
        .request(Method::POST, &format!("/session/{}/", s.id))
        .header("Accept", "application/x-ndjson")
        .json(&body)
        .send()
        .await?;
    if resp.status() != 200 {
        bail!("stream: {} {}", resp.status(), resp.text().await?);
    }
    Ok(resp)
}

/// Every line of a streamed response, each with the time it arrived.
async fn lines(resp: reqwest::Response) -> Result<Vec<(Instant, Value)>> {
    let mut out = Vec::new();
    let mut buf = Vec::new();
    let mut body = resp.bytes_stream();
    while let Some(chunk) = body.next().await {
        buf.extend_from_slice(&chunk?);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            out.push((Instant::now(), serde_json::from_slice(&line[..nl])?));
        }
    }
    if !buf.is_empty() {
        bail!(
            "unterminated last line: {:?}",
            String::from_utf8_lossy(&buf)
        );
    }
    Ok(out)
}

async fn streaming_matches_the_json_response(image: &str) -> Result<()> {
    require_image(image);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(image).await?;
    let commands = json!([
        "echo one; sleep 1; echo two",
        "printf 'h\\303\\251'; exit 3",
        "echo never"
    ]);
    let body = json!({"commands": commands, "fail_fast": true});
    let resp = stream(&cp, &s, body.clone()).await?;
    assert_eq!(
        resp.headers()["content-type"].to_str()?,
        "application/x-ndjson"
    );
    let got = lines(resp).await?;
    let kinds: Vec<&str> = got
        .iter()
        .map(|(_, v)| v["type"].as_str().unwrap_or("?"))
        .collect();
    // Output of command 0 comes before its result, and "one" before "two" by about a second.
    let first_out = got
        .iter()
        .find(|(_, v)| v["type"] == "output" && v["index"] == 0)
        .context("no output line")?;
    assert!(
        first_out.1["data"]
            .as_str()
            .unwrap_or("")
            .starts_with("one"),
        "{kinds:?}"
    );
    let result0 = got
        .iter()
        .position(|(_, v)| v["type"] == "result" && v["index"] == 0);
    let result1 = got
        .iter()
        .position(|(_, v)| v["type"] == "result" && v["index"] == 1);
    let (Some(r0), Some(r1)) = (result0, result1) else {
        bail!("results missing: {got:?}");
    };
    assert!(r0 < r1);
    assert!(
        first_out.0 + Duration::from_millis(500) <= got[r0].0,
        "the first output arrived with the result, not as printed"
    );
    let out0: String = got[..r0]
        .iter()
        .filter(|(_, v)| v["type"] == "output" && v["index"] == 0)
        .map(|(_, v)| v["data"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(out0, "one\ntwo\n");
    let out1: String = got[r0..r1]
        .iter()
        .filter(|(_, v)| v["type"] == "output" && v["index"] == 1)
        .map(|(_, v)| v["data"].as_str().unwrap_or_default())
        .collect();
    assert_eq!(out1, "hé");
    assert_eq!(got[r1].1["exit_code"], 3);
    assert!(
        !got.iter().any(|(_, v)| v["index"] == 2),
        "fail_fast ran command 2"
    );
    let (_, done) = got.last().context("no lines")?;
    assert_eq!(done["type"], "done");
    // `done` is what the plain JSON response says for the same batch, but for what each run
    // cost (`duration_ms`, `cpu_ms`, `max_rss_bytes` differ from run to run).
    let plain = cp.run(&s, body).await?;
    let without_usage = |results: &Value| -> Value {
        let mut results = results.clone();
        for r in results.as_array_mut().into_iter().flatten() {
            let r = r.as_object_mut().expect("a result is an object");
            assert!(r["duration_ms"].is_u64(), "no duration_ms: {r:?}");
            for usage in ["duration_ms", "cpu_ms", "max_rss_bytes"] {
                r.remove(usage);
            }
        }
        results
    };
    assert_eq!(
        without_usage(&done["results"]),
        without_usage(&Value::Array(plain))
    );
    Ok(())
}

#[tokio::test]
async fn streaming_run_order_and_done_match_the_json_response_busybox() -> Result<()> {
    streaming_matches_the_json_response(BUSYBOX).await
}

#[tokio::test]
async fn streaming_run_order_and_done_match_the_json_response_debian() -> Result<()> {
    streaming_matches_the_json_response(DEBIAN).await
}

#[tokio::test]
async fn a_silent_streaming_command_gets_heartbeats_and_its_timeout_result() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[("STREAM_HEARTBEAT_SECONDS", "1")]).await?;
    let s = cp.session_of(BUSYBOX).await?;
    let resp = stream(&cp, &s, json!({"commands": ["sleep 30"], "timeout": 4})).await?;
    let got = lines(resp).await?;
    let beats = got.iter().filter(|(_, v)| v["type"] == "heartbeat").count();
    assert!(beats >= 2, "{got:?}");
    let (_, done) = got.last().context("no lines")?;
    assert_eq!(done["type"], "done");
    assert_eq!(done["results"][0]["exit_code"], 124);
    Ok(())
}

#[tokio::test]
async fn a_client_that_disconnects_kills_its_streaming_batch() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(BUSYBOX).await?;
    let resp = stream(
        &cp,
        &s,
        json!({"commands": ["echo started; sleep 300 & sleep 301; echo never"]}),
    )
    .await?;
    let mut body = resp.bytes_stream();
    let first = body.next().await.context("no first chunk")??;
    assert!(String::from_utf8_lossy(&first).contains("started"));
    drop(body);
    // The very next command already finds no sleep: the session takes commands again (its lock
    // was released) only once the cancelled batch's process group is dead.
    let (code, out) = cp.sh(&s, "ps | grep -c '[s]leep 30' || true").await?;
    assert_eq!(
        (code, out.trim()),
        (0, "0"),
        "the next command overlapped the killed batch"
    );
    Ok(())
}

async fn start(cp: &ControlPlane, s: &Session, body: Value) -> Result<String> {
    let (status, resp) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(body),
        )
        .await?;
    if status != 201 {
        bail!("start: {status} {resp}");
    }
    Ok(resp["process_id"]
        .as_str()
        .context("no process_id")?
        .to_string())
}

async fn poll(cp: &ControlPlane, s: &Session, pid: &str, query: &str) -> Result<Value> {
    let (status, resp) = cp
        .call(
            Method::GET,
            &format!("/session/{}/processes/{pid}/?{query}", s.id),
            None,
        )
        .await?;
    if status != 200 {
        bail!("poll: {status} {resp}");
    }
    Ok(resp)
}

async fn list(cp: &ControlPlane, s: &Session) -> Result<Vec<Value>> {
    let (status, resp) = cp
        .call(Method::GET, &format!("/session/{}/processes/", s.id), None)
        .await?;
    if status != 200 {
        bail!("list: {status} {resp}");
    }
    Ok(resp["processes"].as_array().cloned().unwrap_or_default())
}

async fn stdin(cp: &ControlPlane, s: &Session, pid: &str, data: &str, eof: bool) -> Result<u16> {
    let resp = cp
        .request(
            Method::POST,
            &format!("/session/{}/processes/{pid}/stdin?eof={eof}", s.id),
        )
        .body(data.to_string())
        .send()
        .await?;
    Ok(resp.status().as_u16())
}

/// Output of a process until it ends, following `next_offset`.
async fn output_to_end(cp: &ControlPlane, s: &Session, pid: &str) -> Result<(String, Value)> {
    let mut offset = 0;
    let mut text = String::new();
    for _ in 0..100 {
        let p = poll(cp, s, pid, &format!("offset={offset}&wait=5")).await?;
        text.push_str(p["output"].as_str().unwrap_or_default());
        let next = p["next_offset"].as_u64().context("next_offset")?;
        if p["running"] == false && next == offset {
            return Ok((text, p));
        }
        offset = next;
    }
    bail!("process {pid} never ended")
}

/// Counts the `sleep 311` / `sleep 312` children by their command lines (portable: procps' `ps`
/// shows only names).
const COUNT_CHILD_SLEEPS: &str = "for p in /proc/[0-9]*/cmdline; do tr '\\0' ' ' < $p; echo; done 2>/dev/null | grep -c '^sleep 31[12] $' || true";

async fn process_lifecycle(image: &str, runtime: &str) -> Result<()> {
    require_image(image);
    let cp = ControlPlane::start_with(&[("RUNTIME", runtime)]).await?;
    let s = cp
        .session(json!({"base_image": image, "environment": {"FROM_SESSION": "s1"}}))
        .await?;

    // Output, environment, workdir, exit code; the long poll waits for what comes later.
    let pid = start(
        &cp,
        &s,
        json!({"command": "echo \"$FROM_SESSION $EXTRA $(pwd)\"; sleep 2; echo later; exit 7",
               "environment": {"EXTRA": "x2"}, "workdir": "/workspace/tmp"}),
    )
    .await?;
    let first = poll(&cp, &s, &pid, "offset=0&wait=5").await?;
    assert_eq!(first["output"], "s1 x2 /workspace/tmp\n", "{first}");
    assert_eq!(first["running"], true);
    assert_eq!(first["exit_code"], Value::Null);
    let next = first["next_offset"].as_u64().context("next_offset")?;
    let waited = Instant::now();
    let second = poll(&cp, &s, &pid, &format!("offset={next}&wait=10")).await?;
    assert!(
        waited.elapsed() >= Duration::from_millis(500),
        "the long poll did not wait"
    );
    assert_eq!(second["output"], "later\n", "{second}");
    let (_, end) = output_to_end(&cp, &s, &pid).await?;
    assert_eq!(end["exit_code"], 7);
    let listed = list(&cp, &s).await?;
    let me = listed
        .iter()
        .find(|p| p["process_id"] == pid.as_str())
        .context("not listed")?;
    assert_eq!(me["running"], false);
    assert_eq!(me["exit_code"], 7);
    assert_eq!(stdin(&cp, &s, &pid, "late", false).await?, 409);

    // stdin reaches the process; eof closes it.
    let cat = start(&cp, &s, json!({"command": "cat; echo cat-done"})).await?;
    assert_eq!(stdin(&cp, &s, &cat, "hello ", false).await?, 204);
    assert_eq!(stdin(&cp, &s, &cat, "world\n", true).await?, 204);
    let (text, end) = output_to_end(&cp, &s, &cat).await?;
    assert_eq!(text, "hello world\ncat-done\n");
    assert_eq!(end["exit_code"], 0);

    // Kill takes the whole group: the child sleeps die with the shell.
    let tree = start(&cp, &s, json!({"command": "sleep 311 & sleep 312 & wait"})).await?;
    eventually("children started", Duration::from_secs(10), || async {
        let (_, out) = cp.sh(&s, COUNT_CHILD_SLEEPS).await?;
        Ok((out.trim() == "2").then_some(()))
    })
    .await?;
    let (status, _) = cp
        .call(
            Method::DELETE,
            &format!("/session/{}/processes/{tree}/", s.id),
            None,
        )
        .await?;
    assert_eq!(status, 204);
    eventually("group killed", Duration::from_secs(10), || async {
        let (_, out) = cp.sh(&s, COUNT_CHILD_SLEEPS).await?;
        Ok((out.trim() == "0").then_some(()))
    })
    .await?;
    let (_, end) = output_to_end(&cp, &s, &tree).await?;
    assert_eq!(end["exit_code"], 137);

    // Unknown ids are 404.
    let (status, _) = cp
        .call(
            Method::DELETE,
            &format!("/session/{}/processes/p999-000000000000/", s.id),
            None,
        )
        .await?;
    assert_eq!(status, 404);
    let (status, _) = cp
        .call(
            Method::GET,
            &format!("/session/{}/processes/nope/", s.id),
            None,
        )
        .await?;
    assert_eq!(status, 404);

    // A stopped session restarts with no processes.
    let sleeper = start(&cp, &s, json!({"command": "sleep 600"})).await?;
    assert!(
        list(&cp, &s)
            .await?
            .iter()
            .any(|p| p["process_id"] == sleeper.as_str())
    );
    let (status, _) = cp
        .call(Method::DELETE, &format!("/session/{}/", s.id), None)
        .await?;
    assert_eq!(status, 204);
    assert_eq!(list(&cp, &s).await?, Vec::<Value>::new());
    let (status, _) = cp
        .call(
            Method::GET,
            &format!("/session/{}/processes/{sleeper}/", s.id),
            None,
        )
        .await?;
    assert_eq!(status, 404);

    // Force delete takes them too: the container is gone.
    start(&cp, &s, json!({"command": "sleep 600"})).await?;
    assert_eq!(cp.force_close(&s).await?, 204);
    assert!(e2e::inspect(&s.id).is_none());
    let (status, _) = cp
        .call(Method::GET, &format!("/session/{}/processes/", s.id), None)
        .await?;
    assert_eq!(status, 404);
    Ok(())
}

#[tokio::test]
async fn background_process_lifecycle_busybox() -> Result<()> {
    process_lifecycle(BUSYBOX, "runc").await
}

#[tokio::test]
async fn background_process_lifecycle_debian() -> Result<()> {
    process_lifecycle(DEBIAN, "runc").await
}

#[tokio::test]
async fn background_process_lifecycle_under_gvisor() -> Result<()> {
    process_lifecycle(BUSYBOX, "runsc").await
}

#[tokio::test]
async fn process_output_is_bounded_and_says_it_was_truncated() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[("PROCESS_OUTPUT_BYTES", "1000")]).await?;
    let s = cp.session_of(BUSYBOX).await?;
    // 5000 bytes: "0000\n" .. "0999\n".
    let pid = start(
        &cp,
        &s,
        json!({"command": "i=0; while [ $i -lt 1000 ]; do printf '%04d\\n' $i; i=$((i+1)); done"}),
    )
    .await?;
    let (_, end) = output_to_end(&cp, &s, &pid).await?;
    assert_eq!(end["exit_code"], 0);
    let p = poll(&cp, &s, &pid, "offset=0").await?;
    assert_eq!(p["truncated"], true, "{p}");
    assert_eq!(p["offset"], 4000);
    assert_eq!(p["next_offset"], 5000);
    let out = p["output"].as_str().unwrap_or_default();
    assert!(
        out.starts_with("0800\n") && out.ends_with("0999\n"),
        "{out}"
    );
    // Reading from inside the kept window is not truncated.
    let p = poll(&cp, &s, &pid, "offset=4500").await?;
    assert_eq!(p["truncated"], false);
    assert_eq!(p["output"].as_str().map(str::len), Some(500));
    Ok(())
}

#[tokio::test]
async fn live_processes_are_capped_per_session() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[("MAX_PROCESSES", "2")]).await?;
    let s = cp.session_of(BUSYBOX).await?;
    let a = start(&cp, &s, json!({"command": "sleep 600"})).await?;
    start(&cp, &s, json!({"command": "sleep 600"})).await?;
    let (status, body) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({"command": "true"})),
        )
        .await?;
    assert_eq!(status, 429, "{body}");
    assert!(
        body["detail"].as_str().unwrap_or("").contains("limit"),
        "{body}"
    );
    // One ended: room again.
    cp.call(
        Method::DELETE,
        &format!("/session/{}/processes/{a}/", s.id),
        None,
    )
    .await?;
    eventually("room for one more", Duration::from_secs(10), || async {
        let (status, _) = cp
            .call(
                Method::POST,
                &format!("/session/{}/processes/", s.id),
                Some(json!({"command": "true"})),
            )
            .await?;
        Ok((status == 201).then_some(()))
    })
    .await?;
    // Bad input is refused before anything runs.
    for bad in [
        json!({"command": ""}),
        json!({"command": "true", "workdir": "/workspace/../etc"}),
        json!({"command": "true", "workdir": "tmp"}),
        json!({"command": "true", "process_id": ".hidden"}),
        json!({"command": "true", "tag": "a\nb"}),
        // A session's rule for every environment: a name without `=` (or NUL), not empty.
        json!({"command": "true", "environment": {"X=1": "y"}}),
        json!({"command": "true", "environment": {"": "y"}}),
    ] {
        let (status, _) = cp
            .call(
                Method::POST,
                &format!("/session/{}/processes/", s.id),
                Some(bad.clone()),
            )
            .await?;
        assert_eq!(status, 422, "{bad}");
    }
    Ok(())
}

#[tokio::test]
async fn reads_and_polls_are_answered_while_a_long_command_runs() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[("SESSION_LOCK_WAIT_SECONDS", "1")]).await?;
    let s = cp.session_of(BUSYBOX).await?;
    cp.sh(&s, "echo needle > /workspace/repo/a.txt").await?;
    let pid = start(&cp, &s, json!({"command": "echo bg; sleep 600"})).await?;
    let long = {
        let req = cp
            .request(Method::POST, &format!("/session/{}/", s.id))
            .json(&json!({"commands": ["sleep 8; echo slept"]}));
        tokio::spawn(async move { req.send().await?.json::<Value>().await })
    };
    tokio::time::sleep(Duration::from_millis(700)).await;
    let began = Instant::now();
    let (status, read) = cp
        .call(
            Method::POST,
            &format!("/session/{}/fs/read/", s.id),
            Some(json!({"path": "/workspace/repo/a.txt"})),
        )
        .await?;
    assert_eq!(status, 200, "{read}");
    assert!(
        read["content"].as_str().unwrap_or("").contains("needle"),
        "{read}"
    );
    let (status, grep) = cp
        .call(
            Method::POST,
            &format!("/session/{}/fs/grep/", s.id),
            Some(json!({"pattern": "needle", "path": "/workspace/repo"})),
        )
        .await?;
    assert_eq!(status, 200, "{grep}");
    assert_eq!(grep["matches"].as_array().map(Vec::len), Some(1), "{grep}");
    let p = poll(&cp, &s, &pid, "offset=0").await?;
    assert_eq!(p["output"], "bg\n");
    assert!(
        began.elapsed() < Duration::from_secs(6),
        "the reads waited for the command"
    );
    // A write still waits for the command (and, past the lock wait, is told the session is busy).
    let (status, _) = cp
        .call(
            Method::POST,
            &format!("/session/{}/fs/delete/", s.id),
            Some(json!({"path": "/workspace/repo/a.txt"})),
        )
        .await?;
    assert_eq!(status, 409);
    let done = long.await??;
    assert_eq!(done["results"][0]["output"], "slept\n");
    Ok(())
}

#[tokio::test]
async fn the_reaper_keeps_a_session_with_a_live_process_and_removes_it_once_idle() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[
        ("REAPER_ENABLED", "true"),
        ("REAPER_INTERVAL_SECONDS", "1"),
        ("RUNNING_SESSION_MAX_IDLE_SECONDS", "2"),
    ])
    .await?;
    let s = cp.session_of(BUSYBOX).await?;
    let pid = start(&cp, &s, json!({"command": "sleep 7"})).await?;
    // Idle for longer than the limit, but its job runs: kept.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert!(
        e2e::inspect(&s.id).is_some(),
        "reaped while its process ran"
    );
    let (_, metrics) = {
        let resp = cp.root().request(Method::GET, "/metrics").send().await?;
        (resp.status(), resp.text().await?)
    };
    assert!(
        metrics.contains("daiv_sandbox_processes_started_total 1"),
        "{metrics}"
    );
    let _ = pid;
    // Once it ends, the session is idle like any other and goes.
    eventually("reaped once idle", Duration::from_secs(20), || async {
        Ok(e2e::inspect(&s.id).is_none().then_some(()))
    })
    .await
}

/// Issue 25 #6: the supervisor takes requests from the helper's uid only. A command that speaks
/// its protocol on its socket (to keep the session from ever being reaped with a process the
/// control plane did not start, past `MAX_PROCESSES`) is hung up on, and nothing starts.
#[tokio::test]
async fn a_command_cannot_register_processes_with_the_supervisor() -> Result<()> {
    require_image(DEBIAN);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(DEBIAN).await?;
    let speak = r#"python3 - <<'PY'
import json, socket, struct
req = json.dumps({"action": "start", "command": "sleep 100000", "workdir": "/workspace",
                  "env": [], "max_live": 1000, "buffer_bytes": 64}).encode()
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect("\0daiv-sandbox-processes")
got = b""
try:
    s.sendall(struct.pack(">IIB", len(req) + 5, 0, 1) + req)
    s.settimeout(10)
    got = s.recv(65536)
except OSError:
    pass
print("answer:", got[9:].decode(errors="replace") or "none")
PY"#;
    let (code, out) = cp.sh(&s, speak).await?;
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("answer: none"),
        "the supervisor answered a command: {out}"
    );
    assert!(list(&cp, &s).await?.is_empty());
    let (_, ps) = cp
        .sh(&s, "ps -eo args | grep -c '[s]leep 100000' || true")
        .await?;
    assert_eq!(ps.trim(), "0", "a process started: {ps}");
    Ok(())
}

// === issue 35: two output streams, process event streams, signals, client ids ===

/// Issue 35 #3: a streamed run says which stream each chunk is from, each stream in order;
/// the plain JSON answer keeps one pipe, so its output interleaves them exactly as written.
#[tokio::test]
async fn streamed_runs_keep_stdout_and_stderr_apart() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(BUSYBOX).await?;
    let script = "for i in 1 2 3 4 5; do echo out$i; echo err$i >&2; done";
    let got = lines(stream(&cp, &s, json!({"commands": [script]})).await?).await?;
    let text = |stream: &str| -> String {
        got.iter()
            .filter(|(_, v)| v["type"] == "output" && v["stream"] == stream)
            .map(|(_, v)| v["data"].as_str().unwrap_or_default())
            .collect()
    };
    assert_eq!(text("stdout"), "out1\nout2\nout3\nout4\nout5\n", "{got:?}");
    assert_eq!(text("stderr"), "err1\nerr2\nerr3\nerr4\nerr5\n", "{got:?}");
    assert!(
        got.iter()
            .filter(|(_, v)| v["type"] == "output")
            .all(|(_, v)| v["stream"] == "stdout" || v["stream"] == "stderr"),
        "{got:?}"
    );
    let plain = cp.run(&s, json!({"commands": [script]})).await?;
    assert_eq!(
        plain[0]["output"],
        "out1\nerr1\nout2\nerr2\nout3\nerr3\nout4\nerr4\nout5\nerr5\n"
    );
    Ok(())
}

/// `GET …/events`: its status and, when 200, every line of the body.
async fn events(
    cp: &ControlPlane,
    s: &Session,
    pid: &str,
    query: &str,
) -> Result<(u16, Vec<Value>)> {
    let resp = cp
        .request(
            Method::GET,
            &format!("/session/{}/processes/{pid}/events?{query}", s.id),
        )
        .send()
        .await?;
    let status = resp.status().as_u16();
    if status != 200 {
        return Ok((status, vec![resp.json().await.unwrap_or(Value::Null)]));
    }
    assert_eq!(
        resp.headers()["content-type"].to_str()?,
        "application/x-ndjson"
    );
    Ok((
        status,
        lines(resp).await?.into_iter().map(|(_, v)| v).collect(),
    ))
}

/// The first `n` lines of a followed event stream, then the connection is dropped.
async fn first_events(cp: &ControlPlane, s: &Session, pid: &str, n: usize) -> Result<Vec<Value>> {
    let resp = cp
        .request(
            Method::GET,
            &format!("/session/{}/processes/{pid}/events?follow=true", s.id),
        )
        .send()
        .await?;
    let mut body = resp.bytes_stream();
    let (mut buf, mut out) = (Vec::new(), Vec::new());
    while out.len() < n {
        let Some(chunk) = body.next().await else {
            break;
        };
        buf.extend_from_slice(&chunk?);
        while let Some(nl) = buf.iter().position(|b| *b == b'\n') {
            let line: Vec<u8> = buf.drain(..=nl).collect();
            out.push(serde_json::from_slice(&line[..nl])?);
        }
    }
    out.truncate(n);
    Ok(out)
}

fn stream_text(events: &[Value], kind: &str) -> String {
    events
        .iter()
        .filter(|e| e["type"] == kind)
        .map(|e| e["data"].as_str().unwrap_or_default())
        .collect()
}

/// Issue 35 #4: a process as an event stream — stdout and stderr apart, interrupted and
/// resumed with nothing lost or repeated, a start retried under the client's id answering the
/// same process, a signal ending it with the end event naming it, and events past the buffer
/// a 410.
async fn process_events(image: &str, runtime: &str) -> Result<()> {
    require_image(image);
    let cp = ControlPlane::start_with(&[("RUNTIME", runtime)]).await?;
    let s = cp.session_of(image).await?;
    let command = "for i in 1 2 3 4 5 6; do echo out$i; echo err$i >&2; sleep 0.2; done; exit 5";
    let body =
        json!({"command": command, "process_id": "job-1", "tag": "build", "workdir": "/tmp"});
    let (status, r) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(body.clone()),
        )
        .await?;
    assert_eq!(
        (status, r["process_id"].as_str()),
        (201, Some("job-1")),
        "{r}"
    );
    // The same start again (a client retrying): the same process, not a second one.
    let (status, r) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(body),
        )
        .await?;
    assert_eq!((status, r["existing"].as_bool()), (200, Some(true)), "{r}");
    let (status, r) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({"command": "true", "process_id": "job-1"})),
        )
        .await?;
    assert_eq!(status, 409, "{r}");
    let listed = list(&cp, &s).await?;
    assert_eq!(listed.len(), 1, "{listed:?}");
    assert_eq!(listed[0]["tag"], "build");
    assert!(
        listed[0]["pid"].as_u64().is_some_and(|p| p > 0),
        "{listed:?}"
    );

    // Three events, a disconnect, a resume after the last one seen.
    let head = first_events(&cp, &s, "job-1", 3).await?;
    assert_eq!(head.len(), 3, "{head:?}");
    assert_eq!(head[0]["type"], "start");
    assert_eq!(head[0]["seq"], 1);
    let last = head[2]["seq"].as_u64().context("seq")?;
    let (status, tail) = events(&cp, &s, "job-1", &format!("after={last}&follow=true")).await?;
    assert_eq!(status, 200);
    let all: Vec<Value> = head
        .into_iter()
        .chain(tail.into_iter().filter(|e| e["type"] != "keepalive"))
        .collect();
    let seqs: Vec<u64> = all.iter().filter_map(|e| e["seq"].as_u64()).collect();
    assert_eq!(seqs, (1..=seqs.len() as u64).collect::<Vec<_>>(), "{all:?}");
    assert_eq!(
        stream_text(&all, "stdout"),
        "out1\nout2\nout3\nout4\nout5\nout6\n"
    );
    assert_eq!(
        stream_text(&all, "stderr"),
        "err1\nerr2\nerr3\nerr4\nerr5\nerr6\n"
    );
    let end = all.last().context("no events")?;
    assert_eq!(
        (end["type"].as_str(), end["exit_code"].as_i64()),
        (Some("end"), Some(5)),
        "{end}"
    );
    assert!(end["duration_ms"].is_u64(), "{end}");
    // Without follow: the events so far, the whole history here.
    let (_, again) = events(&cp, &s, "job-1", "").await?;
    assert_eq!(again, all);
    // The offset poll still reads the interleaved bytes.
    let (polled, _) = output_to_end(&cp, &s, "job-1").await?;
    assert_eq!(polled.len(), 6 * 10);

    // A signal ends the whole group; the end event names it.
    let (status, _) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({"command": "sleep 300", "process_id": "sleeper"})),
        )
        .await?;
    assert_eq!(status, 201);
    let path = format!("/session/{}/processes/sleeper/signal", s.id);
    let signal = |sig: Value| cp.call(Method::POST, &path, Some(json!({"signal": sig})));
    assert_eq!(signal(json!("STOP")).await?.0, 422);
    assert_eq!(signal(json!("TERM")).await?.0, 204);
    let (_, ev) = events(&cp, &s, "sleeper", "after=1&follow=true").await?;
    let end = ev.last().context("no end")?;
    assert_eq!(
        (
            end["type"].as_str(),
            end["signal"].as_str(),
            end["exit_code"].as_i64()
        ),
        (Some("end"), Some("TERM"), Some(143)),
        "{ev:?}"
    );
    assert_eq!(signal(json!("KILL")).await?.0, 409);
    assert_eq!(events(&cp, &s, "nope", "").await?.0, 404);
    Ok(())
}

#[tokio::test]
async fn process_events_stream_resume_and_signal_busybox() -> Result<()> {
    process_events(BUSYBOX, "runc").await
}

#[tokio::test]
async fn process_events_stream_resume_and_signal_debian() -> Result<()> {
    process_events(DEBIAN, "runc").await
}

#[tokio::test]
async fn process_events_stream_resume_and_signal_under_gvisor() -> Result<()> {
    process_events(BUSYBOX, "runsc").await
}

/// Issue 35 #4: events that left the bounded buffer are a 410, never a silent gap; the
/// stream without `after` starts from what is kept; a silent process gets keepalives.
#[tokio::test]
async fn events_past_the_buffer_are_gone_and_silences_get_keepalives() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start_with(&[
        ("PROCESS_OUTPUT_BYTES", "1000"),
        ("STREAM_HEARTBEAT_SECONDS", "1"),
    ])
    .await?;
    let s = cp.session_of(BUSYBOX).await?;
    let pid = start(
        &cp,
        &s,
        // The last line alone in its event (a read larger than the buffer keeps no event).
        json!({"command": "i=0; while [ $i -lt 1000 ]; do printf '%04d\\n' $i; i=$((i+1)); done; sleep 0.5; echo last"}),
    )
    .await?;
    output_to_end(&cp, &s, &pid).await?;
    let (status, body) = events(&cp, &s, &pid, "after=1").await?;
    assert_eq!(status, 410, "{body:?}");
    let (status, kept) = events(&cp, &s, &pid, "").await?;
    assert_eq!(status, 200);
    assert_eq!(kept[0]["type"], "start");
    assert_eq!(kept.last().map(|e| e["type"].clone()), Some(json!("end")));
    assert!(stream_text(&kept, "stdout").ends_with("last\n"), "{kept:?}");
    // A resume from the newest kept events is fine.
    let newest = kept[kept.len() - 2]["seq"].as_u64().context("seq")?;
    let (status, rest) = events(&cp, &s, &pid, &format!("after={newest}")).await?;
    assert_eq!((status, rest.len()), (200, 1), "{rest:?}");

    let quiet = start(&cp, &s, json!({"command": "sleep 3; echo late"})).await?;
    let (_, ev) = events(&cp, &s, &quiet, "follow=true").await?;
    let kinds: Vec<&str> = ev.iter().filter_map(|e| e["type"].as_str()).collect();
    assert!(kinds.contains(&"keepalive"), "{kinds:?}");
    assert_eq!(kinds.last(), Some(&"end"), "{kinds:?}");
    let alive = ev
        .iter()
        .find(|e| e["type"] == "keepalive")
        .context("keepalive")?;
    assert_eq!(
        alive["seq"], 1,
        "a keepalive carries the last event's seq: {ev:?}"
    );
    assert_eq!(stream_text(&ev, "stdout"), "late\n");
    Ok(())
}

/// The text of every stdout event so far.
async fn screen(cp: &ControlPlane, s: &Session, pid: &str) -> Result<(String, Vec<Value>)> {
    let (status, ev) = events(cp, s, pid, "").await?;
    ensure_status(status, 200, &ev)?;
    Ok((stream_text(&ev, "stdout"), ev))
}

fn ensure_status(got: u16, want: u16, body: &impl std::fmt::Debug) -> Result<()> {
    if got != want {
        bail!("{got} (wanted {want}): {body:?}");
    }
    Ok(())
}

/// Waits until the terminal shows `want`.
async fn shows(cp: &ControlPlane, s: &Session, pid: &str, want: &str) -> Result<()> {
    eventually(want, Duration::from_secs(20), || async {
        let (text, _) = screen(cp, s, pid).await?;
        Ok(text.contains(want).then_some(()))
    })
    .await
}

/// Issue 35 #6: a process in a terminal — a shell whose `stty size` is the terminal's, resized,
/// typed into, and ended; resizing a process without a terminal is a 409.
async fn terminal(image: &str, runtime: &str) -> Result<()> {
    require_image(image);
    let cp = ControlPlane::start_with(&[("RUNTIME", runtime)]).await?;
    let s = cp.session_of(image).await?;
    let body = json!({"command": "sh", "process_id": "term", "pty": {"cols": 80, "rows": 24}});
    let (status, r) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(body),
        )
        .await?;
    ensure_status(status, 201, &r)?;
    assert_eq!(
        stdin(&cp, &s, "term", "stty size; tty\n", false).await?,
        204
    );
    shows(&cp, &s, "term", "24 80").await?;
    let (text, _) = screen(&cp, &s, "term").await?;
    assert!(text.contains("/dev/pts/"), "not a terminal: {text:?}");
    let resize = |pid: &str, cols: u16, rows: u16| {
        let path = format!("/session/{}/processes/{pid}/resize", s.id);
        let cp = &cp;
        async move {
            cp.call(
                Method::POST,
                &path,
                Some(json!({"cols": cols, "rows": rows})),
            )
            .await
        }
    };
    let (status, r) = resize("term", 100, 30).await?;
    ensure_status(status, 204, &r)?;
    assert_eq!(stdin(&cp, &s, "term", "stty size\n", false).await?, 204);
    shows(&cp, &s, "term", "30 100").await?;
    let listed = list(&cp, &s).await?;
    assert_eq!(listed[0]["pty"], true, "{listed:?}");
    // No terminal, no resize; nor a size out of bounds.
    let plain = start(&cp, &s, json!({"command": "sleep 30"})).await?;
    assert_eq!(resize(&plain, 100, 30).await?.0, 409);
    assert_eq!(resize("term", 0, 30).await?.0, 422);
    assert_eq!(stdin(&cp, &s, "term", "exit 7\n", false).await?, 204);
    let (_, ev) = events(&cp, &s, "term", "after=1&follow=true").await?;
    let end = ev.last().context("no end")?;
    assert_eq!(
        (end["type"].as_str(), end["exit_code"].as_i64()),
        (Some("end"), Some(7)),
        "{ev:?}"
    );
    Ok(())
}

#[tokio::test]
async fn a_process_in_a_terminal_has_its_size_resizes_and_ends() -> Result<()> {
    terminal(DEBIAN, "runc").await
}

#[tokio::test]
async fn a_process_in_a_terminal_under_gvisor() -> Result<()> {
    terminal(BUSYBOX, "runsc").await
}

/// Issue 35 #6: a terminal over a WebSocket — typed into with line editing, a full-screen
/// program (`top`) drawn and quit, a file written in `vi`, its output read, a reconnect replays it from `since`, and the
/// socket closes when the shell exits.
#[tokio::test]
async fn a_terminal_over_a_websocket_replays_on_reconnect() -> Result<()> {
    terminal_over_a_websocket("runc").await
}

#[tokio::test]
async fn a_terminal_over_a_websocket_under_gvisor() -> Result<()> {
    terminal_over_a_websocket("runsc").await
}

async fn terminal_over_a_websocket(runtime: &str) -> Result<()> {
    require_image(DEBIAN);
    let cp = ControlPlane::start_with(&[("RUNTIME", runtime)]).await?;
    let s = cp.session_of(DEBIAN).await?;
    e2e::dataplane::a_terminal_over_a_websocket(&cp, &s.id, runtime == "runsc").await?;
    // Not a terminal: no WebSocket.
    let plain = start(&cp, &s, json!({"command": "sleep 30"})).await?;
    let (status, _) = cp
        .call(
            Method::GET,
            &format!("/session/{}/processes/{plain}/pty", s.id),
            None,
        )
        .await?;
    assert_eq!(status, 409);
    Ok(())
}
