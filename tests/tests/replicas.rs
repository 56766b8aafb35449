//! Two control-plane replicas on one Docker engine, sharing one Redis: per-session locks
//! serialise across replicas, time out with 409, survive a dead holder (TTL), and a Redis outage
//! is a quick 503 that heals by itself.

use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use e2e::redis::Redis;
use e2e::{BUSYBOX, ControlPlane, eventually, require_image};
use reqwest::Method;
use serde_json::json;

fn lock_key(session: &str) -> String {
    format!("daiv-sandbox:session-lock:{session}")
}

/// Two replicas of one deployment (the harness gives each instance a deployment of its own).
async fn replicas(redis: &Redis, extra: &[(&str, &str)]) -> Result<(ControlPlane, ControlPlane)> {
    let url = redis.url();
    let deployment = format!(
        "e2e-{}-{}",
        std::process::id(),
        url.replace([':', '/', '.'], "")
    );
    let mut env = vec![
        ("REDIS_URL", url.as_str()),
        ("DEPLOYMENT", deployment.as_str()),
    ];
    env.extend_from_slice(extra);
    let a = ControlPlane::start_with(&env).await?;
    let b = ControlPlane::start_with(&env).await?;
    Ok((a, b))
}

/// Seconds since boot, from inside the container, before and after a 2 s sleep.
const TIMED: &str = "s=$(cut -d' ' -f1 /proc/uptime); sleep 2; e=$(cut -d' ' -f1 /proc/uptime); echo \"$s $e\" | tee -a /workspace/tmp/spans";

fn span(output: &str) -> Result<(f64, f64)> {
    let mut it = output.split_whitespace().map(str::parse::<f64>);
    match (it.next(), it.next()) {
        (Some(Ok(s)), Some(Ok(e))) => Ok((s, e)),
        _ => bail!("unexpected output {output:?}"),
    }
}

#[tokio::test]
async fn replica_commands_on_one_session_serialise_across_replicas() -> Result<()> {
    require_image(BUSYBOX);
    let redis = Redis::start()?;
    let (a, b) = replicas(&redis, &[]).await?;
    let s = a.session_of(BUSYBOX).await?;

    let started = Instant::now();
    let (ra, rb) = tokio::join!(a.sh(&s, TIMED), b.sh(&s, TIMED));
    let (ca, oa) = ra?;
    let (cb, ob) = rb?;
    assert_eq!((ca, cb), (0, 0), "{oa} / {ob}");
    let (a0, a1) = span(&oa)?;
    let (b0, b1) = span(&ob)?;
    // One ran entirely before the other: the spans, measured inside the container, never overlap.
    assert!(a1 <= b0 || b1 <= a0, "overlap: a {a0}..{a1}, b {b0}..{b1}");
    assert!(started.elapsed() >= Duration::from_secs(4));
    eprintln!("measured: spans a {a0}..{a1}, b {b0}..{b1} (container uptime seconds)");
    // Both wrote to the same file, one after the other.
    let (_, spans) = b.sh(&s, "cat /workspace/tmp/spans").await?;
    assert_eq!(spans.lines().count(), 2, "{spans}");
    // Each replica has its own channel to the session's helper; both serve fs ops.
    for (cp, name) in [(&a, "from-a"), (&b, "from-b")] {
        let (status, r) = cp
            .call(
                reqwest::Method::POST,
                &format!("/session/{}/fs/write", s.id),
                Some(serde_json::json!({"path": format!("/workspace/tmp/{name}"), "content": "eA=="})),
            )
            .await?;
        assert_eq!(
            (status, &r["error"]),
            (200, &serde_json::Value::Null),
            "{r}"
        );
    }
    let (_, listing) = a.sh(&s, "ls /workspace/tmp").await?;
    assert!(
        listing.contains("from-a") && listing.contains("from-b"),
        "{listing}"
    );
    // A removed session leaves no activity record behind (issue 10 #17).
    let key = format!("daiv-sandbox:session-activity:{}", s.id);
    assert!(
        redis.exists(&key)?,
        "activity is recorded while the session lives"
    );
    assert_eq!(a.force_close(&s).await?, 204);
    e2e::eventually(
        "the activity record is deleted",
        Duration::from_secs(5),
        || async { Ok((!redis.exists(&key)?).then_some(())) },
    )
    .await?;
    Ok(())
}

#[tokio::test]
async fn replica_request_that_waits_too_long_gets_409() -> Result<()> {
    require_image(BUSYBOX);
    let redis = Redis::start()?;
    let (a, b) = replicas(&redis, &[("SESSION_LOCK_WAIT_SECONDS", "1")]).await?;
    let s = a.session_of(BUSYBOX).await?;
    let key = lock_key(&s.id);

    let slow = a.sh(&s, "sleep 5; echo done");
    let blocked = async {
        eventually(
            "replica A holds the lock",
            Duration::from_secs(10),
            || async { Ok(redis.exists(&key)?.then_some(())) },
        )
        .await?;
        let t = Instant::now();
        let r = b
            .call(
                Method::POST,
                &format!("/session/{}/", s.id),
                Some(json!({"commands": ["echo never"]})),
            )
            .await?;
        Ok::<_, anyhow::Error>((r, t.elapsed()))
    };
    let (slow, blocked) = tokio::join!(slow, blocked);
    let ((status, body), waited) = blocked?;
    eprintln!("measured: 409 after waiting {waited:?} (SESSION_LOCK_WAIT_SECONDS=1)");
    assert_eq!(status, 409, "{body}");
    assert!(
        body["detail"].as_str().unwrap_or_default().contains("busy"),
        "{body}"
    );
    assert!(
        waited >= Duration::from_millis(900) && waited < Duration::from_secs(5),
        "{waited:?}"
    );
    assert_eq!(slow?, (0, "done\n".to_string()));
    // Released by its owner once done.
    eventually("lock released", Duration::from_secs(5), || async {
        Ok((!redis.exists(&key)?).then_some(()))
    })
    .await?;
    Ok(())
}

#[tokio::test]
async fn replica_lock_of_a_killed_holder_expires_after_its_ttl() -> Result<()> {
    require_image(BUSYBOX);
    let redis = Redis::start()?;
    let (a, b) = replicas(
        &redis,
        &[
            ("SESSION_LOCK_TTL_SECONDS", "3"),
            ("SESSION_LOCK_REFRESH_SECONDS", "0.5"),
            ("SESSION_LOCK_WAIT_SECONDS", "20"),
        ],
    )
    .await?;
    let s = b.session_of(BUSYBOX).await?;
    let key = lock_key(&s.id);

    // A long command on replica A, from a task of its own (A is killed under it).
    let req = a
        .request(reqwest::Method::POST, &format!("/session/{}/", s.id))
        .json(&json!({"commands": ["sleep 60"]}));
    let long = tokio::spawn(async move { req.send().await });
    eventually(
        "replica A holds the lock",
        Duration::from_secs(10),
        || async { Ok(redis.exists(&key)?.then_some(())) },
    )
    .await?;
    // Held past its TTL: the holder refreshes it.
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert!(redis.exists(&key)?, "lock expired while its holder lived");

    drop(a); // SIGKILL: no release, no more refreshes.
    let killed = Instant::now();
    let (code, out) = b.sh(&s, "echo after").await?;
    let waited = killed.elapsed();
    eprintln!("measured: lock of a killed holder free after {waited:?} (TTL 3 s)");
    assert_eq!((code, out.as_str()), (0, "after\n"));
    // It waited for the TTL (at most 3 s after the last refresh), not for the 20 s wait.
    assert!(
        waited >= Duration::from_millis(500) && waited < Duration::from_secs(8),
        "{waited:?}"
    );
    assert!(
        long.await.context("join")?.is_err(),
        "killed replica answered"
    );
    Ok(())
}

#[tokio::test]
async fn replica_redis_outage_is_a_quick_503_and_heals() -> Result<()> {
    require_image(BUSYBOX);
    let mut redis = Redis::start()?;
    let url = redis.url();
    // One deployment: the late replica must see the first one's session.
    let deployment = format!("e2e-{}-outage", std::process::id());
    let env = [
        ("REDIS_URL", url.as_str()),
        ("DEPLOYMENT", deployment.as_str()),
    ];
    let a = ControlPlane::start_with(&env).await?;
    let s = a.session_of(BUSYBOX).await?;
    assert_eq!(a.sh(&s, "echo up").await?, (0, "up\n".to_string()));
    let path = format!("/session/{}/", s.id);
    let body = json!({"commands": ["echo hi"]});

    // A Redis that accepts connections and never answers: bounded by timeouts, still a 503.
    redis.freeze(true)?;
    let t = Instant::now();
    let (status, resp) = a.call(Method::POST, &path, Some(body.clone())).await?;
    eprintln!("measured: 503 with Redis frozen after {:?}", t.elapsed());
    assert_eq!(status, 503, "{resp}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    redis.freeze(false)?;
    eventually(
        "requests succeed after the freeze",
        Duration::from_secs(20),
        || async {
            let (status, _) = a.call(Method::POST, &path, Some(body.clone())).await?;
            Ok((status == 200).then_some(()))
        },
    )
    .await?;

    redis.stop();
    for cp in [&a] {
        let t = Instant::now();
        let (status, resp) = cp.call(Method::POST, &path, Some(body.clone())).await?;
        eprintln!("measured: 503 with Redis down after {:?}", t.elapsed());
        assert_eq!(status, 503, "{resp}");
        assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
        assert!(
            resp["detail"]
                .as_str()
                .unwrap_or_default()
                .contains("Redis"),
            "{resp}"
        );
    }
    // Health does not depend on Redis, and a replica starts while Redis is down.
    let r = a.http().get(format!("{}/-/health/", a.base)).send().await?;
    assert_eq!(r.status(), 200);
    let late = ControlPlane::start_with(&env).await?;
    let t = Instant::now();
    let (status, resp) = late.call(Method::GET, &path, None).await?;
    assert_eq!(status, 503, "{resp}");
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());

    redis.resume()?;
    let back = Instant::now();
    for cp in [&a, &late] {
        eventually(
            "requests succeed again",
            Duration::from_secs(20),
            || async {
                let (status, _) = cp.call(Method::POST, &path, Some(body.clone())).await?;
                Ok((status == 200).then_some(()))
            },
        )
        .await?;
    }
    eprintln!(
        "measured: both replicas served again {:?} after Redis returned",
        back.elapsed()
    );
    Ok(())
}
