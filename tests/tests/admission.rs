//! Admission on real Docker: a burst of creates and seeds past `MAX_CONCURRENT_CREATES` and
//! `MAX_CONCURRENT_SEEDS` is served or refused with 429 + `Retry-After`, never failed; a refused
//! create leaves nothing behind; and the service's peak memory stays within what its settings
//! allow rather than growing with the burst.

use anyhow::{Context, Result};
use e2e::workspace::{Member, gzip, tar_of};
use e2e::{BUSYBOX, ControlPlane, Session, containers_with, networks_with, require_image};
use reqwest::Method;
use serde_json::json;

/// Requests sent at once: far more than the slots and the queue below.
const BURST: usize = 32;
const SLOTS: usize = 2;

/// What one create or seed may hold in flight in this (debug) build, generously: its skeleton
/// archive (the helper binary) or its pipes and decompressor, and their allocator slack. The
/// sizing table in docs/operations/admission.md has the measured figures.
const PER_SLOT_KIB: u64 = 8 * 1024;
/// Everything else a busy service holds: its sessions' helper channels, connections, buffers.
const SLACK_KIB: u64 = 32 * 1024;

/// What one worker saw: the create's status and, when created, the seed's.
struct Outcome {
    create: u16,
    seed: Option<u16>,
    session: Option<Session>,
}

async fn status_and_retry_after(resp: reqwest::Response) -> Result<u16> {
    let status = resp.status().as_u16();
    let retry_after = resp
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    match status {
        200 | 204 => {}
        429 => {
            let secs: u64 = retry_after
                .as_deref()
                .context("429 without Retry-After")?
                .parse()?;
            assert!(secs >= 1, "Retry-After {secs}");
            let detail = body["detail"].as_str().unwrap_or_default();
            assert!(detail.starts_with("too many "), "{body}");
        }
        other => panic!("status {other} in a burst: {body}"),
    }
    Ok(status)
}

async fn worker(cp: &ControlPlane, archive: Vec<u8>) -> Result<Outcome> {
    let resp = cp
        .request(Method::POST, "/session/")
        .json(&json!({"base_image": BUSYBOX}))
        .send()
        .await?;
    let status = resp.status();
    if status.as_u16() != 200 {
        return Ok(Outcome {
            create: status_and_retry_after(resp).await?,
            seed: None,
            session: None,
        });
    }
    let body: serde_json::Value = resp.json().await?;
    let id = body["session_id"].as_str().context("session_id")?;
    let session = Session { id: id.to_string() };
    let part = reqwest::multipart::Part::bytes(archive).file_name("repo.tar.gz");
    let resp = cp
        .request(Method::POST, &format!("/session/{id}/seed/"))
        .multipart(reqwest::multipart::Form::new().part("repo_archive", part))
        .send()
        .await?;
    Ok(Outcome {
        create: 200,
        seed: Some(status_and_retry_after(resp).await?),
        session: Some(session),
    })
}

fn rss_kib(pid: u32) -> Option<u64> {
    integration::cp::rss_kib(pid, "VmRSS:")
}

#[tokio::test]
async fn a_burst_past_the_limits_is_served_or_refused_within_bounded_memory() -> Result<()> {
    require_image(BUSYBOX);
    let slots = SLOTS.to_string();
    let cp = ControlPlane::start_with_process_env(
        &[
            ("MAX_CONCURRENT_CREATES", &slots),
            ("MAX_CONCURRENT_SEEDS", &slots),
            ("ADMISSION_QUEUE_SECONDS", "2"),
            ("ADMISSION_QUEUE_LENGTH", "4"),
            ("LOG_LEVEL", "INFO"),
        ],
        // As the image runs it: two malloc arenas.
        &[("MALLOC_ARENA_MAX", "2")],
    )
    .await?;
    let files: Vec<(String, Vec<u8>)> = (0..200)
        .map(|i| (format!("./pkg{}/mod_{i}.py", i % 10), vec![b'x'; 2000]))
        .collect();
    let members: Vec<Member<'_>> = files
        .iter()
        .map(|(name, data)| Member::File(name, data, 0o644))
        .collect();
    let archive = gzip(&tar_of(&members)?)?;
    let before = rss_kib(cp.pid()).context("service RSS")?;

    let outcomes =
        futures::future::join_all((0..BURST).map(|_| worker(&cp, archive.clone()))).await;
    let outcomes: Vec<Outcome> = outcomes.into_iter().collect::<Result<_>>()?;
    let peak = cp.peak_rss_kib().context("service peak RSS")?;

    let created = outcomes.iter().filter(|o| o.create == 200).count();
    let seeded = outcomes.iter().filter(|o| o.seed == Some(204)).count();
    let refused = outcomes
        .iter()
        .filter(|o| o.create == 429 || o.seed == Some(429))
        .count();
    assert!(seeded > 0, "nothing was served");
    assert!(
        refused > 0,
        "{BURST} requests at once never went past {SLOTS} slots and a queue of 4"
    );

    // A refused create reached nothing: the deployment holds exactly the created sessions.
    let label = format!("daiv.sandbox.deployment={}", cp.deployment);
    assert_eq!(containers_with(&[&label]).len(), created);
    for o in &outcomes {
        if let Some(s) = &o.session {
            assert_eq!(cp.force_close(s).await?, 204);
        }
    }
    assert!(containers_with(&[&label]).is_empty(), "sessions left");
    assert!(networks_with(&[&label]).is_empty(), "networks left");

    let metrics = cp.metrics().await?;
    let counted: u64 = metrics
        .lines()
        .filter(|l| l.starts_with("daiv_sandbox_admission_refused_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum();
    assert_eq!(counted, refused as u64, "{metrics}");

    eprintln!(
        "burst of {BURST}: {created} created, {seeded} seeded, {refused} refused; RSS {before} KiB \
         before, {peak} KiB peak"
    );
    // The bound follows the settings, not the burst: without admission each of the 32 creates
    // would hold its skeleton at once.
    let bound = before + 2 * SLOTS as u64 * PER_SLOT_KIB + SLACK_KIB;
    assert!(
        peak <= bound,
        "peak RSS {peak} KiB over {bound} KiB (started at {before} KiB; {created} created, \
         {seeded} seeded, {refused} refused)"
    );
    Ok(())
}
