//! The data plane end to end: raw files up and down through the helper's channel (1 GiB, with
//! the service's memory sampled while it streams), ranges, and the refusals (422, 416, 413, permission_denied, the service's own
//! directory).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Result, ensure};
use e2e::{ControlPlane, DEBIAN, require_image};
use futures::StreamExt;
use reqwest::Method;

const GIB: u64 = 1024 * 1024 * 1024;
const CHUNK: usize = 1024 * 1024;

/// Chunk `i` of the test file: its index in every 8 bytes, so any misplaced byte shows.
fn chunk(i: u64) -> Vec<u8> {
    let mut v = Vec::with_capacity(CHUNK);
    while v.len() < CHUNK {
        v.extend_from_slice(&i.to_le_bytes());
    }
    v
}

/// Samples the service's resident memory every 50 ms until stopped; the peak (KiB).
fn sample(
    cp: &ControlPlane,
    stop: Arc<AtomicBool>,
) -> (Arc<AtomicU64>, std::thread::JoinHandle<()>) {
    let peak = Arc::new(AtomicU64::new(0));
    let pid = cp.pid();
    let p = peak.clone();
    let t = std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            if let Ok(s) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                && let Some(kib) = s
                    .lines()
                    .find(|l| l.starts_with("VmRSS:"))
                    .and_then(|l| l.split_whitespace().nth(1))
                    .and_then(|v| v.parse::<u64>().ok())
            {
                p.fetch_max(kib, Ordering::Relaxed);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    });
    (peak, t)
}

#[tokio::test]
async fn a_gib_goes_up_and_down_in_frames_and_the_service_memory_stays_flat() -> Result<()> {
    require_image(DEBIAN);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(DEBIAN).await?;
    let path = format!("/session/{}/files?path=/home/sandbox/big.bin", s.id);
    let before = cp.rss_kib().unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    let (peak, sampler) = sample(&cp, stop.clone());

    let n = GIB / CHUNK as u64;
    let body = futures::stream::iter((0..n).map(|i| Ok::<_, std::io::Error>(chunk(i))));
    let r = cp
        .request(Method::PUT, &path)
        .header("content-length", GIB.to_string())
        .body(reqwest::Body::wrap_stream(body))
        .send()
        .await?;
    let status = r.status().as_u16();
    let text = r.text().await?;
    ensure!(status == 200, "PUT: {status} {text}");
    let up_peak = peak.swap(0, Ordering::Relaxed);

    let r = cp.request(Method::GET, &path).send().await?;
    ensure!(r.status().as_u16() == 200, "GET: {}", r.status());
    ensure!(r.content_length() == Some(GIB), "{:?}", r.content_length());
    let mut stream = r.bytes_stream();
    let (mut at, mut pending) = (0u64, Vec::new());
    while let Some(b) = stream.next().await {
        pending.extend_from_slice(&b?);
        while pending.len() >= CHUNK {
            let rest = pending.split_off(CHUNK);
            ensure!(pending == chunk(at), "chunk {at} differs");
            pending = rest;
            at += 1;
        }
    }
    ensure!(
        at == n && pending.is_empty(),
        "{at} chunks, {} bytes over",
        pending.len()
    );
    let down_peak = peak.load(Ordering::Relaxed);
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    println!(
        "1 GiB: service RSS before {before} KiB, peak while uploading {up_peak} KiB, while downloading {down_peak} KiB"
    );
    // The file never lives in the service: its memory grows by far less than the file.
    ensure!(
        up_peak < before + 128 * 1024,
        "upload: {up_peak} KiB from {before}"
    );
    ensure!(
        down_peak < before + 128 * 1024,
        "download: {down_peak} KiB from {before}"
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
