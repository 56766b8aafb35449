//! In-process tests of the session inventory (`GET /sessions/`, `/info/`), metadata and a
//! session's own lifetime (`timeout_seconds`, `/timeout/`, the reaper's deadline), over the fake
//! engine. Real Docker: `tests/tests/inventory.rs`.

mod harness;

use std::collections::HashSet;
use std::time::{Duration, SystemTime};

use axum::http::StatusCode;
use control_plane::engine::fake::FakeEngine;
use control_plane::engine::{ContainerEngine, ROLE_LABEL, ROLE_SESSION_RECORD};
use control_plane::pool::Refill;
use serde_json::{Value, json};

use harness::{Harness, IMAGE};

async fn records(engine: &FakeEngine) -> usize {
    engine
        .list_volumes(&[(ROLE_LABEL, ROLE_SESSION_RECORD)])
        .await
        .expect("volumes")
        .len()
}

/// Every session of a walk over pages of `limit` (with `filters`), in the order given.
async fn walk(h: &Harness, filters: &str, limit: usize) -> Vec<Value> {
    let mut out = Vec::new();
    let mut next: Option<String> = None;
    loop {
        let mut url = format!("/sessions/?limit={limit}{filters}");
        if let Some(n) = &next {
            url.push_str(&format!("&next={n}"));
        }
        let (status, page) = h.api("GET", &url, None).await;
        assert_eq!(status, StatusCode::OK, "{url}: {page}");
        let sessions = page["sessions"].as_array().expect("sessions").clone();
        assert!(sessions.len() <= limit);
        out.extend(sessions);
        match page["next"].as_str() {
            Some(n) => next = Some(n.to_string()),
            None => return out,
        }
    }
}

fn ids(list: &[Value]) -> Vec<String> {
    list.iter()
        .map(|s| s["session_id"].as_str().expect("id").to_string())
        .collect()
}

#[tokio::test]
async fn sessions_are_listed_with_their_metadata_filtered_and_paged() {
    let h = Harness::default();
    let plain = h.session().await;
    let tagged = h
        .create(json!({
            "base_image": IMAGE,
            "metadata": {"team": "a", "run": "1"},
            "memory_bytes": 64 << 20,
            "cpus": 0.5,
        }))
        .await;
    let other = h
        .create(json!({"base_image": IMAGE, "metadata": {"team": "b"}}))
        .await;
    // A session without metadata or a lifetime costs no record.
    assert_eq!(records(&h.engine).await, 2);

    let all = walk(&h, "", 100).await;
    assert_eq!(ids(&all).len(), 3);
    let t = all
        .iter()
        .find(|s| s["session_id"] == json!(tagged))
        .expect("listed");
    assert_eq!(t["metadata"], json!({"team": "a", "run": "1"}));
    assert_eq!(t["state"], json!("running"));
    assert_eq!(t["base_image"], json!(IMAGE));
    assert_eq!(t["memory_bytes"], json!(64 << 20));
    assert_eq!(t["cpus"], json!(0.5));
    assert_eq!(t["egress"], json!(false));
    assert_eq!(t["expires_at"], Value::Null);
    assert_eq!(t["engine"], json!("default"));

    let team_a = walk(&h, "&metadata=team=a", 100).await;
    assert_eq!(ids(&team_a), vec![tagged.clone()]);
    let both = walk(&h, "&metadata=team=a&metadata=run=1", 100).await;
    assert_eq!(ids(&both), vec![tagged.clone()]);
    assert!(
        walk(&h, "&metadata=team=a&metadata=run=2", 100)
            .await
            .is_empty()
    );

    // Closed (stopped) sessions are listed as such; the state filter sees it.
    let (status, _) = h.api("DELETE", &format!("/session/{other}/"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let stopped = walk(&h, "&state=stopped", 100).await;
    assert_eq!(ids(&stopped), vec![other.clone()]);
    let running: HashSet<String> = ids(&walk(&h, "&state=running", 100).await)
        .into_iter()
        .collect();
    assert_eq!(running, HashSet::from([plain.clone(), tagged.clone()]));

    // Info answers the listing's object; the reference's status stays a bare 204.
    let (status, info) = h
        .api("GET", &format!("/session/{tagged}/info/"), None)
        .await;
    assert_eq!(status, StatusCode::OK, "{info}");
    assert_eq!(&info, t);
    let (status, body) = h.api("GET", &format!("/session/{tagged}/"), None).await;
    assert_eq!((status, body), (StatusCode::NO_CONTENT, Value::Null));

    // A force close takes the record with it.
    let (status, _) = h
        .api("DELETE", &format!("/session/{tagged}/?force=true"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    assert_eq!(records(&h.engine).await, 1);
    let (status, _) = h
        .api("GET", &format!("/session/{tagged}/info/"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_walk_lists_every_session_that_lives_through_it_once() {
    let h = Harness::default();
    let mut lived = Vec::new();
    for i in 0..7 {
        lived.push(
            h.create(json!({"base_image": IMAGE, "metadata": {"i": i.to_string()}}))
                .await,
        );
    }
    let doomed = h.session().await;
    // Page by page, with sessions made and removed between the pages.
    let mut seen = Vec::new();
    let mut next: Option<String> = None;
    let mut made = Vec::new();
    loop {
        let url = match &next {
            Some(n) => format!("/sessions/?limit=3&next={n}"),
            None => "/sessions/?limit=3".to_string(),
        };
        let (status, page) = h.api("GET", &url, None).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        seen.extend(ids(page["sessions"].as_array().expect("page")));
        if next.is_none() {
            let (status, _) = h
                .api("DELETE", &format!("/session/{doomed}/?force=true"), None)
                .await;
            assert_eq!(status, StatusCode::NO_CONTENT);
        }
        made.push(h.session().await);
        match page["next"].as_str() {
            Some(n) => next = Some(n.to_string()),
            None => break,
        }
    }
    let unique: HashSet<&String> = seen.iter().collect();
    assert_eq!(unique.len(), seen.len(), "a session listed twice: {seen:?}");
    for id in &lived {
        assert!(
            seen.contains(id),
            "{id} lived through the walk but was not listed"
        );
    }
}

#[tokio::test]
async fn bad_listing_and_lifetime_input_is_refused_naming_the_field() {
    let h = Harness::default();
    let id = h.session().await;
    for (url, named) in [
        ("/sessions/?colour=red", "colour"),
        ("/sessions/?state=sleeping", "state"),
        ("/sessions/?metadata=novalue", "metadata"),
        ("/sessions/?limit=0", "limit"),
        ("/sessions/?limit=5000", "limit"),
        ("/sessions/?next=forged.cursor", "next"),
    ] {
        let (status, body) = h.api("GET", url, None).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{url}: {body}");
        assert!(
            body["detail"].as_str().is_some_and(|d| d.contains(named)),
            "{url}: {body}"
        );
    }
    let long_value = "v".repeat(513);
    let many: serde_json::Map<String, Value> =
        (0..33).map(|i| (format!("k{i}"), json!("v"))).collect();
    for body in [
        json!({"base_image": IMAGE, "metadata": {"bad key": "v"}}),
        json!({"base_image": IMAGE, "metadata": {"k".repeat(65): "v"}}),
        json!({"base_image": IMAGE, "metadata": {"k": long_value}}),
        json!({"base_image": IMAGE, "metadata": many}),
        json!({"base_image": IMAGE, "metadata": {"k": 1}}),
        json!({"base_image": IMAGE, "timeout_seconds": 0}),
        json!({"base_image": IMAGE, "timeout_seconds": -5}),
        json!({"base_image": IMAGE, "timeout_seconds": 2_592_001}),
        json!({"base_image": IMAGE, "on_timeout": "explode"}),
    ] {
        let (status, err) = h.api("POST", "/session/", Some(body.clone())).await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {err}");
    }
    for body in [
        json!({"timeout_seconds": 0}),
        json!({"timeout_seconds": 2_592_001}),
        json!({}),
    ] {
        let (status, err) = h
            .api(
                "POST",
                &format!("/session/{id}/timeout/"),
                Some(body.clone()),
            )
            .await;
        assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}: {err}");
    }
    // Nothing was made by the refused creates.
    assert_eq!(walk(&h, "", 100).await.len(), 1);
    assert_eq!(records(&h.engine).await, 0);
}

#[tokio::test]
async fn another_deployments_sessions_and_cursors_are_not_ours() {
    let engine = FakeEngine::default();
    let a = Harness::new(engine.clone(), &[("DEPLOYMENT", "a")]);
    let b = Harness::new(engine.clone(), &[("DEPLOYMENT", "b")]);
    for _ in 0..3 {
        a.create(json!({"base_image": IMAGE, "metadata": {"who": "a"}}))
            .await;
    }
    let theirs = b
        .create(json!({"base_image": IMAGE, "metadata": {"who": "b"}}))
        .await;
    let mine = walk(&a, "", 100).await;
    assert_eq!(mine.len(), 3);
    assert!(!ids(&mine).contains(&theirs));
    let (_, page) = a.api("GET", "/sessions/?limit=1", None).await;
    let cursor = page["next"].as_str().expect("a next page").to_string();
    let (status, _) = b
        .api("GET", &format!("/sessions/?limit=1&next={cursor}"), None)
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
    // Nor may a cursor be taken to other filters.
    let (status, _) = a
        .api(
            "GET",
            &format!("/sessions/?limit=1&state=paused&next={cursor}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY);
}

#[tokio::test]
async fn deadlines_end_pause_or_spare_sessions_as_set() {
    let h = Harness::default();
    let removed = h
        .create(json!({"base_image": IMAGE, "timeout_seconds": 5}))
        .await;
    let paused = h
        .create(json!({"base_image": IMAGE, "timeout_seconds": 5, "on_timeout": "pause", "metadata": {"keep": "me"}}))
        .await;
    let extended = h
        .create(json!({"base_image": IMAGE, "timeout_seconds": 5}))
        .await;
    let untimed = h.session().await;

    let (_, info) = h
        .api("GET", &format!("/session/{removed}/info/"), None)
        .await;
    let expires = info["expires_at"].as_str().expect("a deadline");
    assert!(!expires.is_empty());
    assert_eq!(info["on_timeout"], json!("remove"));

    // Extended twice: the deadline moves, the metadata and on_timeout stay.
    for secs in [600, 3600] {
        let (status, moved) = h
            .api(
                "POST",
                &format!("/session/{extended}/timeout/"),
                Some(json!({"timeout_seconds": secs})),
            )
            .await;
        assert_eq!(status, StatusCode::OK, "{moved}");
        assert_ne!(moved["expires_at"], info["expires_at"]);
    }
    // One record per session, however often its deadline moved.
    assert_eq!(records(&h.engine).await, 3);
    // A session without a deadline gets one.
    let (status, given) = h
        .api(
            "POST",
            &format!("/session/{untimed}/timeout/"),
            Some(json!({"timeout_seconds": 7200})),
        )
        .await;
    assert_eq!(status, StatusCode::OK, "{given}");
    assert!(given["expires_at"].is_string());

    let reaper = h.cell().reaper().clone();
    let swept = reaper
        .sweep(SystemTime::now() + Duration::from_secs(60))
        .await
        .expect("sweep");
    assert_eq!(swept.timed_out, vec![removed.clone()], "{swept:?}");
    assert_eq!(swept.paused, vec![paused.clone()], "{swept:?}");
    let (status, _) = h
        .api("GET", &format!("/session/{removed}/info/"), None)
        .await;
    assert_eq!(status, StatusCode::NOT_FOUND);
    let (_, p) = h
        .api("GET", &format!("/session/{paused}/info/"), None)
        .await;
    assert_eq!(p["state"], json!("paused"));
    assert_eq!(p["metadata"], json!({"keep": "me"}));
    for id in [&extended, &untimed] {
        let (_, s) = h.api("GET", &format!("/session/{id}/info/"), None).await;
        assert_eq!(s["state"], json!("running"), "{s}");
    }
    // A busy session is spared until a sweep finds it free: the command is not killed.
    let (status, _) = h
        .api(
            "POST",
            &format!("/session/{extended}/timeout/"),
            Some(json!({"timeout_seconds": 1})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let held = h
        .sessions()
        .lock(&harness::sid(&extended))
        .await
        .expect("lock");
    let later = SystemTime::now() + Duration::from_secs(120);
    let swept = reaper.sweep(later).await.expect("sweep");
    assert!(swept.busy.contains(&extended), "{swept:?}");
    drop(held);
    let swept = reaper.sweep(later).await.expect("sweep");
    assert_eq!(swept.timed_out, vec![extended.clone()], "{swept:?}");
    // The removed sessions' records went with them.
    assert_eq!(records(&h.engine).await, 2);
}

/// Seconds from now to an `expires_at`.
fn left(info: &Value) -> i64 {
    let at = time::OffsetDateTime::parse(
        info["expires_at"].as_str().expect("a deadline"),
        &time::format_description::well_known::Rfc3339,
    )
    .expect("rfc3339");
    (at - time::OffsetDateTime::now_utc()).whole_seconds()
}

/// A session its deadline paused gets a deadline again when a request thaws it (its last
/// timeout, from then), so it cannot run on without one; the new deadline pauses it again.
#[tokio::test]
async fn a_thaw_after_the_deadline_paused_a_session_arms_a_new_deadline() {
    let h = Harness::default();
    let id = h
        .create(json!({"base_image": IMAGE, "timeout_seconds": 30, "on_timeout": "pause"}))
        .await;
    let extended = h
        .create(json!({"base_image": IMAGE, "timeout_seconds": 5, "on_timeout": "pause"}))
        .await;
    // The last timeout set is the one armed again.
    let (status, _) = h
        .api(
            "POST",
            &format!("/session/{extended}/timeout/"),
            Some(json!({"timeout_seconds": 600})),
        )
        .await;
    assert_eq!(status, StatusCode::OK);
    let reaper = h.cell().reaper().clone();
    let swept = reaper
        .sweep(SystemTime::now() + Duration::from_secs(700))
        .await
        .expect("sweep");
    let mut paused = swept.paused.clone();
    paused.sort();
    let mut both = vec![id.clone(), extended.clone()];
    both.sort();
    assert_eq!(paused, both, "{swept:?}");
    let (_, info) = h.api("GET", &format!("/session/{id}/info/"), None).await;
    assert_eq!(
        (info["state"].clone(), info["expires_at"].clone()),
        (json!("paused"), Value::Null),
        "{info}"
    );

    // Any request thaws it (the native API's rule), and it has a deadline again.
    for (session, timeout) in [(&id, 30), (&extended, 600)] {
        let (status, _) = h.api("GET", &format!("/session/{session}/"), None).await;
        assert_eq!(status, StatusCode::NO_CONTENT);
        let (_, info) = h
            .api("GET", &format!("/session/{session}/info/"), None)
            .await;
        assert_eq!(info["state"], json!("running"), "{info}");
        let left = left(&info);
        assert!(
            left > timeout - 30 && left <= timeout,
            "{left} s left: {info}"
        );
    }
    // Which it keeps: the next deadline pauses it again.
    let swept = reaper
        .sweep(SystemTime::now() + Duration::from_secs(60))
        .await
        .expect("sweep");
    assert_eq!(swept.paused, vec![id.clone()], "{swept:?}");
    // A session paused by hand keeps the deadline it had through a thaw.
    let (status, _) = h
        .api("POST", &format!("/session/{extended}/pause/"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, before) = h
        .api("GET", &format!("/session/{extended}/info/"), None)
        .await;
    let (status, _) = h.api("GET", &format!("/session/{extended}/"), None).await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (_, after) = h
        .api("GET", &format!("/session/{extended}/info/"), None)
        .await;
    assert_eq!(after["expires_at"], before["expires_at"], "{after}");
}

#[tokio::test]
async fn a_claimed_member_is_listed_from_its_claim() {
    let engine = FakeEngine::default();
    let h = Harness::new(engine.clone(), &[("WARM_POOL", "img:1=1")]);
    Refill::new(h.cell().pool().clone(), h.locks.clone())
        .reconcile_all()
        .await;
    let before = h.api("GET", "/sessions/", None).await.1;
    assert_eq!(before["sessions"], json!([]), "a member is not a session");
    let id = h
        .create(json!({"base_image": IMAGE, "memory_bytes": 64 << 20, "cpus": 1.5, "metadata": {"m": "1"}}))
        .await;
    assert!(
        engine
            .name(&id)
            .is_some_and(|n| n.starts_with("daiv-claimed-")),
        "not claimed"
    );
    let (_, s) = h.api("GET", &format!("/session/{id}/info/"), None).await;
    assert_eq!(s["memory_bytes"], json!(64 << 20), "{s}");
    assert_eq!(s["cpus"], json!(1.5), "{s}");
    assert_eq!(s["metadata"], json!({"m": "1"}), "{s}");
    let created = time::OffsetDateTime::parse(
        s["created_at"].as_str().expect("created_at"),
        &time::format_description::well_known::Rfc3339,
    )
    .expect("rfc3339");
    let age = time::OffsetDateTime::now_utc() - created;
    assert!(age.whole_seconds() < 60, "created_at is the claim's: {s}");
}

#[tokio::test]
async fn metrics_are_sampled_as_rates_and_bounded_per_session() {
    let engine = FakeEngine::default();
    let h = Harness::new(engine.clone(), &[("SESSION_METRICS_SAMPLES", "3")]);
    let id = h
        .create(json!({"base_image": IMAGE, "cpus": 1.0, "memory_bytes": 256 << 20}))
        .await;
    let reading = |cpu_ms: u64, mem_mib: u64| control_plane::engine::ContainerStats {
        cpu_total_ns: cpu_ms * 1_000_000,
        online_cpus: 8,
        mem_usage: mem_mib << 20,
        mem_cache: 2 << 20,
        mem_limit: 256 << 20,
    };
    // Asked before any round: one sample taken there and then (two readings make its rate).
    engine.set_stats(&id, reading(1_000, 10));
    let (status, first) = h.api("GET", &format!("/session/{id}/metrics/"), None).await;
    assert_eq!(status, StatusCode::OK, "{first}");
    let samples = first["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), 1, "{first}");
    let s = &samples[0];
    assert_eq!(
        s["cpu_count"],
        json!(1.0),
        "the session's limit, not the host's 8"
    );
    assert_eq!(s["cpu_used_pct"], json!(0.0), "{s}");
    assert_eq!(s["mem_used"], json!(8 << 20), "usage less the cache: {s}");
    assert_eq!(s["mem_cache"], json!(2 << 20));
    assert_eq!(s["mem_total"], json!(256 << 20));
    assert!(s["disk_total"].as_u64().is_some_and(|t| t > 0), "{s}");

    // Load: half a second of CPU per half second of wall time is about 100% of one CPU.
    let sessions = h.sessions();
    let mut cpu = 1_000;
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(500)).await;
        cpu += 500;
        engine.set_stats(&id, reading(cpu, 100));
        sessions.sample_all().await;
    }
    let (_, busy) = h.api("GET", &format!("/session/{id}/metrics/"), None).await;
    let samples = busy["samples"].as_array().expect("samples");
    assert_eq!(samples.len(), 3, "kept: SESSION_METRICS_SAMPLES: {busy}");
    for s in samples {
        let pct = s["cpu_used_pct"].as_f64().expect("pct");
        assert!((60.0..=100.0).contains(&pct), "{s}");
        assert_eq!(s["mem_used"], json!(98 << 20), "{s}");
    }
    // A window in the future is empty; a gone session's series goes with it.
    let (_, none) = h
        .api(
            "GET",
            &format!("/session/{id}/metrics/?start=99999999999"),
            None,
        )
        .await;
    assert_eq!(none["samples"], json!([]));
    let (status, _) = h
        .api("DELETE", &format!("/session/{id}/?force=true"), None)
        .await;
    assert_eq!(status, StatusCode::NO_CONTENT);
    let (status, _) = h.api("GET", &format!("/session/{id}/metrics/"), None).await;
    assert_eq!(status, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn a_page_holds_up_to_a_thousand_sessions() {
    let h = Harness::default();
    for _ in 0..1001 {
        h.session().await;
    }
    let started = std::time::Instant::now();
    let (status, page) = h.api("GET", "/sessions/?limit=1000", None).await;
    let took = started.elapsed();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(page["sessions"].as_array().map(Vec::len), Some(1000));
    let next = page["next"].as_str().expect("one more");
    let (_, last) = h
        .api("GET", &format!("/sessions/?limit=1000&next={next}"), None)
        .await;
    assert_eq!(last["sessions"].as_array().map(Vec::len), Some(1));
    assert_eq!(last["next"], Value::Null);
    println!("a page of 1,000 over the fake engine: {took:?}");
}

/// `order=desc` walks the same sessions newest first, page by page (its cursors its own);
/// `created_after` keeps those created at or after a second.
#[tokio::test]
async fn a_walk_newest_first_and_a_floor_on_creation() {
    let h = Harness::default();
    let mut made = Vec::new();
    for _ in 0..5 {
        made.push(h.session().await);
    }
    let asc = ids(&walk(&h, "", 2).await);
    assert_eq!(asc.len(), 5);
    let mut desc = ids(&walk(&h, "&order=desc", 2).await);
    assert_eq!(desc.len(), 5);
    desc.reverse();
    assert_eq!(desc, asc, "newest first is oldest first reversed");
    // A cursor of one order is not the other's.
    let (_, first) = h.api("GET", "/sessions/?limit=2", None).await;
    let next = first["next"].as_str().expect("a next page");
    let (status, body) = h
        .api(
            "GET",
            &format!("/sessions/?limit=2&order=desc&next={next}"),
            None,
        )
        .await;
    assert_eq!(status, StatusCode::UNPROCESSABLE_ENTITY, "{body}");

    // At the newest session's second: it and any of that second; a second later: none.
    let (_, newest) = h.api("GET", "/sessions/?order=desc&limit=1", None).await;
    let at = newest["sessions"][0]["created_at"]
        .as_str()
        .expect("created_at");
    let at = time::OffsetDateTime::parse(at, &time::format_description::well_known::Rfc3339)
        .expect("RFC 3339")
        .unix_timestamp();
    let from_then = ids(&walk(&h, &format!("&created_after={at}"), 100).await);
    assert!(from_then.contains(&desc[4]), "{from_then:?}");
    let from_later = walk(&h, &format!("&created_after={}", at + 1), 100).await;
    assert!(from_later.is_empty(), "{from_later:?}");
    let from_before = walk(&h, &format!("&created_after={}", at - 3600), 100).await;
    assert_eq!(from_before.len(), 5);
}
