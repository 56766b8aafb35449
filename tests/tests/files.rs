//! The data plane end to end: raw files up and down through the helper's channel (1 GiB, with
//! the service's memory sampled while it streams), ranges, and the refusals (422, 416, 413, permission_denied, the service's own
//! directory).

use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::{BUSYBOX, ControlPlane, DEBIAN, require_image};
use reqwest::Method;

#[tokio::test]
async fn a_gib_goes_up_and_down_in_frames_and_the_service_memory_stays_flat() -> Result<()> {
    require_image(DEBIAN);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(DEBIAN).await?;
    let t = e2e::dataplane::round_trip(&cp, &s.id, "/home/sandbox/big.bin", 1024).await?;
    println!("1 GiB: {t:?}");
    // The file never lives in the service: its memory grows by far less than the file.
    ensure!(t.up_peak_kib < t.before_kib + 128 * 1024, "upload: {t:?}");
    ensure!(
        t.down_peak_kib < t.before_kib + 128 * 1024,
        "download: {t:?}"
    );
    Ok(())
}

#[tokio::test]
async fn ranges_and_refusals() -> Result<()> {
    require_image(DEBIAN);
    let cp = ControlPlane::start_with(&[("FILE_MAX_BYTES", "1000")]).await?;
    let s = cp.session_of(DEBIAN).await?;
    let file = |p: &str| format!("/session/{}/files?path={p}", s.id);
    let r = cp
        .request(Method::PUT, &file("/tmp/r.txt"))
        .body("0123456789")
        .send()
        .await?;
    ensure!(r.status().as_u16() == 200);
    let r = cp
        .request(Method::GET, &file("/tmp/r.txt"))
        .header("range", "bytes=2-4")
        .send()
        .await?;
    ensure!(r.status().as_u16() == 206);
    ensure!(r.headers()["content-range"] == "bytes 2-4/10");
    ensure!(&r.bytes().await?[..] == b"234");
    let r = cp
        .request(Method::GET, &file("/tmp/r.txt"))
        .header("range", "bytes=10-")
        .send()
        .await?;
    ensure!(r.status().as_u16() == 416, "{}", r.status());

    let code_of = |v: &serde_json::Value| v["code"].as_str().unwrap_or_default().to_string();
    // Over the cap: 413, nothing written.
    let r = cp
        .request(Method::PUT, &file("/tmp/big"))
        .body(vec![0u8; 2000])
        .send()
        .await?;
    ensure!(r.status().as_u16() == 413, "{}", r.status());
    let r = cp.request(Method::GET, &file("/tmp/big")).send().await?;
    ensure!(
        r.status().as_u16() == 404,
        "nothing was written: {}",
        r.status()
    );
    // Relative and `..` paths.
    for bad in ["tmp/x", "/tmp/../etc/passwd"] {
        let r = cp.request(Method::GET, &file(bad)).send().await?;
        ensure!(r.status().as_u16() == 422, "{bad}: {}", r.status());
        ensure!(code_of(&r.json().await?) == "invalid_path");
    }
    // The sandbox user's permissions: root's files are out of its reach.
    let r = cp
        .request(Method::PUT, &file("/etc/daiv-e2e"))
        .body("x")
        .send()
        .await?;
    ensure!(r.status().as_u16() == 403, "{}", r.status());
    ensure!(code_of(&r.json().await?) == "permission_denied");
    let r = cp.request(Method::GET, &file("/etc/shadow")).send().await?;
    ensure!(r.status().as_u16() == 403, "{}", r.status());
    // The service's directory, by its name and through a link the sandbox planted.
    let (code, _) = cp.sh(&s, "ln -s /.daiv-sandbox /tmp/svc").await?;
    ensure!(code == 0);
    for p in [
        "/.daiv-sandbox/daiv-sandbox-helper",
        "/tmp/svc/daiv-sandbox-helper",
        "/proc/self/root/.daiv-sandbox/daiv-sandbox-helper",
    ] {
        let r = cp.request(Method::GET, &file(p)).send().await?;
        ensure!(r.status().as_u16() == 403, "{p}: {}", r.status());
        ensure!(code_of(&r.json().await?) == "permission_denied", "{p}");
    }
    let r = cp
        .request(Method::PUT, &file("/tmp/svc/planted"))
        .body("x")
        .send()
        .await?;
    ensure!(r.status().as_u16() == 403, "{}", r.status());
    Ok(())
}

// === watches (issue 35 #5) ===

/// A recursive watch, armed before a command creates 1,000 files and a directory with a file
/// in it: every create is seen, none lost; the refusals are statuses with their codes.
async fn a_watch_sees_every_create(image: &str, runtime: &str) -> Result<()> {
    require_image(image);
    let cp = ControlPlane::start_with(&[("RUNTIME", runtime)]).await?;
    let s = cp.session_of(image).await?;
    e2e::dataplane::a_watch_sees_a_thousand_creates(&cp, &s.id, "/workspace/tmp/w").await?;
    let (code, out) = cp.sh(&s, "echo x > /workspace/tmp/f").await?;
    ensure!(code == 0, "{out}");
    // Refusals, before the body: a missing path, a file, a relative path.
    for (query, want, code) in [
        ("path=/workspace/tmp/missing", 404, "not_found"),
        ("path=/workspace/tmp/f", 409, "not_a_directory"),
        ("path=tmp", 422, "invalid_path"),
    ] {
        let resp = cp
            .request(Method::GET, &format!("/session/{}/watch?{query}", s.id))
            .send()
            .await?;
        ensure!(resp.status().as_u16() == want, "{query}: {}", resp.status());
        let body: serde_json::Value = resp.json().await?;
        ensure!(body["code"] == code, "{query}: {body}");
    }
    // The session still serves.
    let (code, out) = cp.sh(&s, "ls /workspace/tmp/w | wc -l").await?;
    ensure!(code == 0 && out.trim() == "1002", "{out}");
    Ok(())
}

#[tokio::test]
async fn a_watch_sees_a_thousand_creates_from_a_command() -> Result<()> {
    a_watch_sees_every_create(DEBIAN, "runc").await
}

#[tokio::test]
async fn a_watch_sees_a_thousand_creates_under_gvisor() -> Result<()> {
    // Busybox: this runsc fails coreutils' `ls` (statx), see the gVisor notes.
    a_watch_sees_every_create(BUSYBOX, "runsc").await
}

/// A watch whose client stops reading never holds the session up: its changes are dropped past
/// a bounded queue (an `overflow` says so when it reads again; none is lost silently), and
/// commands go on. The client's receive buffer is kept small, so the kernel's buffers do not
/// hide the service's.
#[tokio::test]
async fn a_watch_that_is_not_read_does_not_hold_the_session_up() -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    require_image(DEBIAN);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(DEBIAN).await?;
    cp.sh(&s, "mkdir -p /workspace/tmp/flood").await?;
    let url = cp.url(&format!(
        "/session/{}/watch?path=/workspace/tmp/flood",
        s.id
    ));
    let rest = url.strip_prefix("http://").unwrap_or(&url);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.set_recv_buffer_size(4096)?;
    let mut conn = sock.connect(host.parse()?).await?;
    let req = format!(
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {}\r\n\r\n",
        cp.key
    );
    conn.write_all(req.as_bytes()).await?;
    let mut got = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let has = |got: &[u8], what: &str| got.windows(what.len()).any(|w| w == what.as_bytes());
    while !has(&got, r#""type":"armed""#) {
        let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf)).await??;
        ensure!(
            n > 0,
            "closed before armed: {}",
            String::from_utf8_lossy(&got)
        );
        got.extend_from_slice(&buf[..n]);
    }
    // 15,000 changes of ~860 bytes each (12.9 MB of lines) nobody reads.
    let (code, out) = cp
        .sh(
            &s,
            "cd /workspace/tmp/flood && n=$(printf '%0200d' 0) && i=0; \
             while [ $i -lt 15000 ]; do : > ${n}_$i; i=$((i+1)); done; echo done",
        )
        .await?;
    ensure!(code == 0 && out.ends_with("done\n"), "{out}");
    let (code, out) = cp.sh(&s, "echo still").await?;
    ensure!(code == 0 && out == "still\n", "{out}");
    // Reading again: what was queued, then the overflow where changes were dropped. On a loaded
    // machine the helper may still be handing the flood over when the client reads again, and
    // a client that then keeps up loses nothing: every create arrives and no overflow is due.
    // What must never happen is a change lost without an overflow saying so.
    let (mut total, mut creates, mut line) = (0usize, 0usize, Vec::new());
    loop {
        let n = tokio::time::timeout(Duration::from_secs(60), conn.read(&mut buf))
            .await
            .map_err(|_| {
                anyhow::anyhow!(
                    "{} changes lost without an overflow ({total} bytes read)",
                    15_000 - creates
                )
            })??;
        ensure!(
            n > 0,
            "the stream ended after {total} bytes without an overflow"
        );
        total += n;
        let mut overflow = false;
        for &b in &buf[..n] {
            if b != b'\n' {
                line.push(b);
                continue;
            }
            creates += usize::from(has(&line, r#""type":"create""#));
            overflow |= has(&line, r#""type":"overflow""#);
            line.clear();
        }
        if overflow || creates == 15_000 {
            eprintln!("read {total} bytes: {creates} creates, overflow: {overflow}");
            ensure!(
                !overflow || creates < 15_000,
                "an overflow after every change arrived"
            );
            break;
        }
    }
    Ok(())
}

/// A download whose client stops reading holds up the session's other requests for a bounded
/// time only (the service gives the download up), instead of for as long as the client waits.
#[tokio::test]
async fn a_download_nobody_reads_does_not_hold_the_session_up() -> Result<()> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    require_image(DEBIAN);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(DEBIAN).await?;
    let (code, out) = cp
        .sh(
            &s,
            "head -c 134217728 /dev/zero > /workspace/tmp/big && echo made",
        )
        .await?;
    ensure!(code == 0, "{out}");
    let url = cp.url(&format!("/session/{}/files?path=/workspace/tmp/big", s.id));
    let rest = url.strip_prefix("http://").unwrap_or(&url);
    let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
    let sock = tokio::net::TcpSocket::new_v4()?;
    sock.set_recv_buffer_size(4096)?;
    let mut conn = sock.connect(host.parse()?).await?;
    let req = format!(
        "GET /{path} HTTP/1.1\r\nHost: {host}\r\nX-API-Key: {}\r\n\r\n",
        cp.key
    );
    conn.write_all(req.as_bytes()).await?;
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(30), conn.read(&mut buf)).await??;
    ensure!(
        buf[..n].starts_with(b"HTTP/1.1 200"),
        "{}",
        String::from_utf8_lossy(&buf[..n])
    );
    // Nobody reads on: the session still answers a command (after the download is given up).
    let answered = tokio::time::timeout(Duration::from_secs(120), cp.sh(&s, "echo still")).await;
    let Ok(Ok((0, out))) = answered else {
        anyhow::bail!("the session did not answer while a download stalled: {answered:?}");
    };
    ensure!(out == "still\n", "{out}");
    // The download was cut short: reading on ends before its 128 MiB. The cut comes a stall
    // (30 s) after the client stopped reading, which the command above may not have waited
    // for (it can run beside the download): each read may wait past that.
    let mut total = n;
    loop {
        match tokio::time::timeout(Duration::from_secs(90), conn.read(&mut buf)).await? {
            Ok(0) | Err(_) => break,
            Ok(k) => total += k,
        }
    }
    ensure!(total < 128 << 20, "the whole file came: {total}");
    Ok(())
}
