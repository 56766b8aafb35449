//! One sandbox must not starve the others of the kernel's per-uid limits (docs/operations/
//! isolation.md, "What sessions share under runc"). Under runc, code in a session opens inotify
//! instances until its uid's limit (`fs.inotify.max_user_instances`) and holds them:
//! - the service's own watches in another session of that uid keep working (the helper's
//!   instances count against its own uid);
//! - with `RUN_UID_RANGE`, a second deployment on the same engine gives each session a uid of
//!   its own, and programs in its sessions keep their inotify while one of them holds its own
//!   uid's instances.
//!
//! Each deployment here runs its sessions under uids no other test uses, so the instances held
//! never touch the sessions of suites running beside it.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use e2e::dataplane::{Lines, watch};
use e2e::{ControlPlane, DEBIAN, DeploymentGuard, Session, require_image};
use reqwest::Method;
use serde_json::json;

/// Opens inotify instances until the kernel refuses one, says how many and why, then holds them.
const HOLD: &str = r#"python3 -c '
import ctypes, resource, time
soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 100000:
    fd = libc.inotify_init()
    if fd < 0:
        break
    fds.append(fd)
print(len(fds), ctypes.get_errno(), flush=True)
time.sleep(900)
'"#;

/// Opens one inotify instance; prints `ok`, or the errno of the refusal.
const ONE: &str = r#"python3 -c '
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init()
print("ok" if fd >= 0 else "errno %d" % ctypes.get_errno())
'"#;

const EMFILE: i64 = 24;

/// Starts [`HOLD`] in `s` as a background process; the number of instances it holds, once the
/// kernel refused it one more with `EMFILE`.
async fn hold_every_instance(cp: &ControlPlane, s: &Session) -> Result<u64> {
    let (status, r) = cp
        .call(
            Method::POST,
            &format!("/session/{}/processes/", s.id),
            Some(json!({"command": HOLD, "process_id": "hold"})),
        )
        .await?;
    ensure!(status == 201, "start: {status} {r}");
    let resp = cp
        .request(
            Method::GET,
            &format!("/session/{}/processes/hold/events?follow=true", s.id),
        )
        .send()
        .await?;
    ensure!(resp.status().as_u16() == 200, "events: {}", resp.status());
    let mut lines = Lines::of(resp);
    let mut out = String::new();
    while !out.contains('\n') {
        let Some(e) = lines.next().await? else {
            bail!("the holder ended: {out:?}");
        };
        match e["type"].as_str() {
            Some("stdout") | Some("stderr") => out.push_str(e["data"].as_str().unwrap_or_default()),
            Some("end") => bail!("the holder ended: {out:?} {e}"),
            _ => {}
        }
    }
    let mut words = out.split_whitespace();
    let held: u64 = words.next().context("count")?.parse()?;
    let errno: i64 = words.next().context("errno")?.parse()?;
    ensure!(
        errno == EMFILE,
        "the kernel refused with errno {errno}: {out:?}"
    );
    Ok(held)
}

/// The session's uid, as its commands see it.
async fn uid(cp: &ControlPlane, s: &Session) -> Result<u32> {
    let (code, out) = cp.sh(s, "id -u").await?;
    ensure!(code == 0, "id -u: {out}");
    Ok(out.trim().parse()?)
}

/// A watch on `/workspace` in `s` arms, and sees a file created there.
async fn the_service_watches(cp: &ControlPlane, s: &Session) -> Result<()> {
    let (status, mut lines) = watch(cp, &s.id, "path=/workspace").await?;
    let first = lines.next().await?.unwrap_or_default();
    ensure!(status == 200, "watch: {status} {first}");
    ensure!(first["type"] == "armed", "the watch did not arm: {first}");
    let (code, out) = cp.sh(s, "echo x > /workspace/seen").await?;
    ensure!(code == 0, "{out}");
    loop {
        let Some(l) = tokio::time::timeout(Duration::from_secs(20), lines.next()).await?? else {
            bail!("the watch ended before the create");
        };
        if l["path"] == "/workspace/seen" {
            return Ok(());
        }
    }
}

#[tokio::test]
async fn a_session_holding_its_uids_inotify_instances_starves_no_other_session() -> Result<()> {
    require_image(DEBIAN);
    // Deployment A: every session one uid, as by default (not 1000: suites beside this one use it).
    let a = ControlPlane::start_with(&[("RUN_UID", "30731"), ("RUN_GID", "30731")]).await?;
    // Deployment B, on the same engine: a uid of its own for each session. Its forks' and
    // snapshots' payloads outlive their sessions (the reaper's to collect, off in tests): the
    // guard removes everything labelled with the deployment.
    let dep_b = format!("e2e-{}-uid-range", std::process::id());
    let _guard = DeploymentGuard(dep_b.clone());
    let b = ControlPlane::start_with(&[("DEPLOYMENT", &dep_b), ("RUN_UID_RANGE", "30740-30799")])
        .await?;

    let hostile = a.session_of(DEBIAN).await?;
    let victim = a.session_of(DEBIAN).await?;
    ensure!(uid(&a, &hostile).await? == 30731 && uid(&a, &victim).await? == 30731);
    let held = hold_every_instance(&a, &hostile).await?;
    ensure!(held > 0, "the holder got no instance at all");
    eprintln!("the hostile session holds {held} inotify instances of uid 30731");

    // The hostile session holds them: a program in the other session of its uid is refused one,
    // which shows what runc sessions of one uid share...
    let (code, out) = a.sh(&victim, ONE).await?;
    ensure!(
        code == 0 && out.trim() == format!("errno {EMFILE}"),
        "the victim's program was not starved, so nothing was held: {code} {out}"
    );
    // ...but the service's own watch in that session works.
    the_service_watches(&a, &victim)
        .await
        .context("a watch in a session of the starved uid")?;

    // B's sessions have uids of their own, none of A's.
    let b1 = b.session_of(DEBIAN).await?;
    let b2 = b.session_of(DEBIAN).await?;
    let (u1, u2) = (uid(&b, &b1).await?, uid(&b, &b2).await?);
    ensure!(
        (30740..=30799).contains(&u1) && (30740..=30799).contains(&u2) && u1 != u2,
        "uids {u1} and {u2}"
    );
    // A holding uid 30731's instances takes nothing from B's programs...
    let (code, out) = b.sh(&b1, ONE).await?;
    ensure!(code == 0 && out.trim() == "ok", "{code} {out}");
    // ...and one of B's sessions holding its own uid's takes nothing from the other's.
    hold_every_instance(&b, &b1).await?;
    let (code, out) = b.sh(&b2, ONE).await?;
    ensure!(code == 0 && out.trim() == "ok", "{code} {out}");
    the_service_watches(&b, &b1)
        .await
        .context("a watch in the session that holds its uid's instances")?;
    // The files a ranged session makes are its uid's.
    let (code, out) = b
        .sh(&b2, "touch /workspace/mine && stat -c %u /workspace/mine")
        .await?;
    ensure!(code == 0 && out.trim() == u2.to_string(), "{code} {out}");

    // Sessions from a snapshot of b2, and its forks, run as b2's uid: its files are that uid's.
    let (status, forked) = b
        .call(
            Method::POST,
            &format!("/session/{}/fork/", b2.id),
            Some(json!({"count": 1})),
        )
        .await?;
    ensure!(status == 201, "fork: {status} {forked}");
    let fork = Session {
        id: forked["session_ids"][0].as_str().context("a fork")?.into(),
    };
    let (status, snap) = b
        .call(
            Method::POST,
            &format!("/session/{}/snapshot/", b2.id),
            Some(json!({})),
        )
        .await?;
    ensure!(status == 201 || status == 200, "snapshot: {status} {snap}");
    let snap = snap["snapshot_id"]
        .as_str()
        .context("a snapshot id")?
        .to_string();
    let from = b
        .session(json!({"base_image": DEBIAN, "snapshot_id": snap}))
        .await?;
    for s in [&fork, &from] {
        ensure!(uid(&b, s).await? == u2, "{} is not b2's uid", s.id);
        let (code, out) = b
            .sh(s, "echo more >> /workspace/mine && cat /workspace/mine")
            .await?;
        ensure!(code == 0 && out.trim() == "more", "{code} {out}");
    }
    drop(from);
    let (status, _) = b
        .call(Method::DELETE, &format!("/snapshots/{snap}/"), None)
        .await?;
    ensure!(status == 204 || status == 200, "snapshot delete: {status}");
    Ok(())
}
