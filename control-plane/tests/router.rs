//! In-process tests of the HTTP surface against the fake engine: routing, auth, status codes,
//! JSON shapes and the session logic's decisions. Real Docker is exercised by the `e2e` crate.

mod harness;

use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use control_plane::coordination::lock::SessionLocks;
use control_plane::engine::fake::FakeEngine;
use control_plane::engine::{ContainerStatus, NetworkAttach};
use serde_json::{Value, json};

use harness::Harness;

#[tokio::test]
async fn api_key_is_required_on_api_routes_only() {
    let h = Harness::default();
    let (s, b) = h
        .call(
            "POST",
            "/api/v1/session/",
            Some(json!({"base_image": "x"})),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(b, json!({"detail": "API Key header is missing"}));
    let (s, b) = h
        .call(
            "POST",
            "/api/v1/session/",
            Some(json!({"base_image": "x"})),
            Some("nope"),
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    assert_eq!(b, json!({"detail": "Invalid API Key"}));
    for path in [
        "/-/health/",
        "/-/health",
        "/api/v1/-/health/",
        "/-/version/",
        "/api/v1/-/version/",
    ] {
        let (s, _) = h.call("GET", path, None, None).await;
        assert_eq!(s, StatusCode::OK, "{path}");
    }
    let (_, b) = h.call("GET", "/-/version/", None, None).await;
    assert_eq!(b["version"], env!("CARGO_PKG_VERSION"));
    assert!(!h.engine.calls().iter().any(|c| c.starts_with("create")));
}

#[tokio::test]
async fn health_is_503_when_the_engine_does_not_answer() {
    let h = Harness::default();
    h.engine.set_down(true);
    let (s, b) = h.call("GET", "/-/health/", None, None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(b["detail"], "Docker client is not responding");
}

#[tokio::test]
async fn create_applies_isolation_defaults_and_ignores_unknown_fields() {
    let h = Harness::default();
    let (s, b) = h
        .api(
            "POST",
            "/session",
            Some(json!({"base_image": "img:1", "dockerfile": "FROM x", "environment": {"A": "1", "HOME": "/custom"},
                        "memory_bytes": 268435456, "cpus": 0.5, "future_field": [1, 2]})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let id = b["session_id"].as_str().expect("id");
    assert_eq!(id.len(), 64);
    let spec = h.engine.spec(id).expect("created");
    // Root only until the helper takes its own uid; commands run as RUN_UID:RUN_GID, and the
    // container keeps exactly what the helper needs to start and stop them.
    assert_eq!(spec.user.as_deref(), Some("0:0"));
    assert_eq!(
        spec.cmd.as_deref().map(|c| c[1..].join(" ")),
        Some("init --user 1000:1000 --helper-user 65533:65533".to_string())
    );
    assert_eq!(spec.cap_add, ["SETUID", "SETGID", "KILL"]);
    assert_eq!(
        spec.sysctls,
        [(
            "net.ipv6.conf.all.disable_ipv6".to_string(),
            "1".to_string()
        )]
    );
    assert_eq!(
        spec.labels
            .get("daiv.sandbox.helper-user")
            .map(String::as_str),
        Some("65533:65533")
    );
    assert_eq!(
        spec.labels
            .get("daiv.sandbox.sandbox-user")
            .map(String::as_str),
        Some("1000:1000")
    );
    assert!(spec.init);
    assert_eq!(spec.network, NetworkAttach::None);
    assert_eq!(spec.memory_bytes, Some(268_435_456));
    assert_eq!(spec.nano_cpus, Some(500_000_000));
    assert_eq!(spec.runtime, "runc");
    assert!(spec.pids_limit > 0);
    // The caller's environment is never the container's (a commit would keep it): it is the
    // session's environment file, on a volume of its own.
    assert!(
        spec.env
            .iter()
            .all(|(k, v)| k != "A" && v != "/custom" && v != "1"),
        "{:?}",
        spec.env
    );
    assert!(spec.env.contains(&("HOME".into(), "/home/sandbox".into())));
    assert!(
        spec.labels.values().all(|v| v != "/custom"),
        "{:?}",
        spec.labels
    );
    // Everything the sandbox user can write is a volume of its own (a snapshot copies them
    // and commits nothing), and so is the session's own directory.
    let mut expected = vec![
        control_plane::layout::WORKSPACE,
        control_plane::layout::SESSION_DIR,
    ];
    expected.extend(control_plane::layout::STATE[1..].iter().map(|(_, p)| *p));
    assert_eq!(spec.volumes, expected);
    assert_eq!(spec.labels["daiv.sandbox.state"], "volumes");
    assert_eq!(
        h.engine
            .file(id, control_plane::layout::ENV_FILE)
            .map(|f| String::from_utf8_lossy(&f).into_owned())
            .as_deref(),
        Some(r#"[["A","1"],["HOME","/custom"]]"#)
    );
    assert!(spec.skeleton_archive().expect("readable").is_some());
    assert_eq!(h.engine.status(id), Some(ContainerStatus::Running));
    // Commands see it, and the caller's environment wins over our defaults.
    let (s, ran) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["printf '%s %s' \"$A\" \"$HOME\""]})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{ran}");
    assert_eq!(ran["results"][0]["output"], json!("1 /custom"));
}

/// A burst of creates must not build one skeleton archive (most of it the helper binary) each.
#[tokio::test]
async fn isolated_sessions_share_one_skeleton_archive() {
    let h = Harness::default();
    let (a, b) = (h.session().await, h.session().await);
    // The sandbox user's directories, then the service's part (the helper), then its own files.
    let skeleton = |id: &str| {
        h.engine
            .spec(id)
            .and_then(|s| s.skeleton.get(1).cloned())
            .expect("a skeleton")
    };
    assert!(skeleton(&a).same(&skeleton(&b)), "one buffer");
    // A session's environment is in its own small part; the shared one stays shared.
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "img:1", "environment": {"OWN": "value"}})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let c = b["session_id"].as_str().expect("id");
    assert!(skeleton(c).same(&skeleton(&a)), "one buffer");
    let own = h.engine.spec(c).expect("spec").skeleton;
    assert_eq!(own.len(), 3);
    assert!(own[0].len() < 8192, "{}", own[0].len());
    assert!(own[2].len() < 8192, "{}", own[2].len());
}

/// With `RUN_UID_RANGE`, each sandbox runs as a uid of the range that no other sandbox on the
/// engine holds, says so on its label and owns its directories; without one, `RUN_UID`.
#[tokio::test]
async fn a_uid_range_gives_each_sandbox_a_uid_of_its_own() {
    let h = Harness::new(
        FakeEngine::default(),
        &[("RUN_UID_RANGE", "7000-7002"), ("RUN_GID", "3000")],
    );
    let mut uids = std::collections::BTreeSet::new();
    for _ in 0..3 {
        let id = h.session().await;
        let spec = h.engine.spec(&id).expect("created");
        let label = spec.labels["daiv.sandbox.sandbox-user"].clone();
        let (uid, gid) = label.split_once(':').expect("uid:gid");
        assert_eq!(gid, "3000");
        let uid: u32 = uid.parse().expect("a uid");
        assert!((7000..=7002).contains(&uid), "{label}");
        assert!(uids.insert(uid), "{label} twice");
        assert_eq!(
            spec.cmd.as_deref().map(|c| c[2..4].join(" ")),
            Some(format!("--user {label}"))
        );
        let head = spec.skeleton[0].as_bytes().expect("in memory").clone();
        let mut dirs = tar::Archive::new(&head[..]);
        for entry in dirs.entries().expect("entries") {
            let entry = entry.expect("entry");
            let path = format!("/{}", entry.path().expect("path").display());
            let path = path.trim_end_matches('/');
            // The shared temporary directories are root's, the rest the sandbox user's.
            let owner = match control_plane::layout::SHARED_TMP.contains(&path) {
                true => 0,
                false => u64::from(uid),
            };
            assert_eq!(entry.header().uid().expect("uid"), owner, "{path}");
        }
    }
    // Every uid is held: a fourth create is told to come back later.
    let (s, b) = h
        .api("POST", "/session/", Some(json!({"base_image": "img:1"})))
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    assert!(
        b["detail"].as_str().unwrap_or("").contains("RUN_UID_RANGE"),
        "{b}"
    );
}

#[tokio::test]
async fn runtime_setting_reaches_the_container() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("RUNTIME", "runsc"),
            ("RUN_UID", "2000"),
            ("RUN_GID", "3000"),
        ],
    );
    let id = h.session().await;
    let spec = h.engine.spec(&id).expect("created");
    assert_eq!(spec.runtime, "runsc");
    assert_eq!(
        spec.cmd.as_deref().map(|c| c[2..].join(" ")),
        Some("--user 2000:3000 --helper-user 65533:65533".to_string())
    );
}

/// Under `runsc`, with no probe image and no pool (the defaults): the first session of an image
/// has it probed in the background; then `/-/health/` lists the image and its verdict, the
/// session's info carries a warning, and a failed command's answer a header saying why, while
/// its output stays the command's.
#[tokio::test]
async fn under_runsc_each_sessions_image_is_probed_and_an_unsound_one_is_told() {
    // Answers the probe as coreutils 9.1 on runsc release-20221219 does.
    let engine = FakeEngine::new(|cmd| control_plane::engine::fake::FakeExec {
        chunks: if cmd.contains("check ls ls /") {
            vec![
                b"ls\t2\tls: cannot access '/': Invalid argument\n".to_vec(),
                b"stat\t1\tstat: cannot statx '/': Invalid argument\n".to_vec(),
            ]
        } else {
            Vec::new()
        },
        exit_code: 0,
    });
    let h = Harness::new(engine, &[("RUNTIME", "runsc")]);
    let (s, b) = h.call("GET", "/-/health/", None, None).await;
    assert_eq!(s, StatusCode::OK);
    assert_eq!(b["runtime"]["runsc"]["sound"], Value::Null, "{b}");
    assert!(b["runtime"]["runsc"].get("images").is_none(), "{b}");

    let id = h.session().await;
    let other = h.session().await;
    let mut health = Value::Null;
    for _ in 0..2000 {
        let (_, b) = h.call("GET", "/-/health/", None, None).await;
        health = b["runtime"]["runsc"].clone();
        if health["sound"].is_boolean() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    assert_eq!(health["sound"], false, "{health}");
    assert_eq!(health["failing"], json!(["ls", "stat"]));
    let images = health["images"].as_array().expect("images");
    assert_eq!(images.len(), 1, "one image, probed once: {health}");
    assert_eq!(images[0]["image"], harness::IMAGE);
    assert_eq!(images[0]["engine"], "default");
    assert_eq!(images[0]["sound"], false);
    assert!(
        images[0]["image_id"]
            .as_str()
            .is_some_and(|i| !i.is_empty())
    );
    let probes = h
        .engine
        .calls()
        .iter()
        .filter(|c| c.starts_with("create sha256:"))
        .count();
    assert_eq!(probes, 1, "{:?}", h.engine.calls());

    // The client: the session's info says what fails and the fix.
    let (s, info) = h.api("GET", &format!("/session/{id}/info/"), None).await;
    assert_eq!(s, StatusCode::OK, "{info}");
    let warning = info["runtime_warning"].as_str().expect("runtime_warning");
    assert!(warning.contains("ls, stat fail"), "{warning}");
    assert!(warning.contains("release-20230227.0"), "{warning}");
    let (_, list) = h.api("GET", "/sessions/", None).await;
    let listed = list["sessions"].as_array().expect("sessions");
    assert!(
        listed
            .iter()
            .all(|s| s["runtime_warning"] == info["runtime_warning"]),
        "{list}"
    );

    // A failed command: its output is its own, the warning is a header beside it.
    let run = |cmd: &str| {
        axum::http::Request::builder()
            .method("POST")
            .uri(format!("/session/{other}/"))
            .header("x-api-key", harness::KEY)
            .header("content-type", "application/json")
            .body(axum::body::Body::from(
                json!({"commands": [cmd]}).to_string(),
            ))
            .expect("request")
    };
    let resp = h.send(run("echo out; exit 3")).await;
    let header = resp
        .headers()
        .get("x-daiv-sandbox-warning")
        .map(|v| v.to_str().expect("ascii").to_string());
    let body = harness::json_body(resp).await;
    assert_eq!(body["results"][0]["exit_code"], 3, "{body}");
    assert_eq!(body["results"][0]["output"], "out\n");
    assert!(
        header
            .as_deref()
            .is_some_and(|h| h.contains("ls, stat fail")),
        "{header:?}"
    );
    // A command that worked needs no warning.
    let resp = h.send(run("true")).await;
    assert!(resp.headers().get("x-daiv-sandbox-warning").is_none());
}

#[tokio::test]
async fn bad_requests_are_rejected_before_touching_the_engine() {
    let h = Harness::default();
    for body in [
        json!({}),
        json!({"base_image": ""}),
        json!({"base_image": "a b"}),
        json!({"base_image": "x", "memory_bytes": 10}),
        json!({"base_image": "x", "cpus": -1}),
        json!({"base_image": "x", "environment": {"A=B": "1"}}),
        json!({"base_image": 5}),
    ] {
        let (s, b) = h.api("POST", "/session/", Some(body.clone())).await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{body} -> {b}");
        assert!(b["detail"].is_string(), "{b}");
    }
    assert!(!h.engine.calls().iter().any(|c| c.starts_with("create")));
}

#[tokio::test]
async fn egress_without_a_ca_is_400() {
    let h = Harness::default();
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "x", "egress": {"policy": {"default": "allow"}}})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    // The reference's sentence: DAIV matches "egress proxy" in the lower-cased body to tell its
    // operator to configure the CA, and fails the run closed.
    assert_eq!(
        b["detail"],
        "egress requires the egress proxy, which is not configured on this deployment"
    );
    assert!(b.to_string().to_lowercase().contains("egress proxy"));
    assert!(!h.engine.calls().iter().any(|c| c.starts_with("create")));
}

#[tokio::test]
async fn an_image_that_cannot_be_pulled_is_a_4xx_naming_it() {
    let h = Harness::default();
    h.engine.set_missing_image("ghost:latest");
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "ghost:latest"})),
        )
        .await;
    assert_eq!(s, StatusCode::BAD_REQUEST);
    let detail = b["detail"].as_str().unwrap_or("");
    assert!(
        detail.contains("ghost:latest") && detail.contains("refused access"),
        "{detail}"
    );
    // The daemon's own words stay in the log.
    assert!(!detail.contains("pull access denied"), "{detail}");
    assert!(!h.engine.calls().iter().any(|c| c.starts_with("create")));
}

#[tokio::test]
async fn unknown_sessions_are_404_on_every_route() {
    let h = Harness::default();
    let ghost = "f".repeat(64);
    for (method, path, body) in [
        ("GET", format!("/session/{ghost}/"), None),
        (
            "POST",
            format!("/session/{ghost}/"),
            Some(json!({"commands": ["true"]})),
        ),
        ("DELETE", format!("/session/{ghost}/"), None),
        ("DELETE", format!("/session/{ghost}/?force=true"), None),
        ("GET", "/session/not-an-id/".to_string(), None),
        ("GET", "/session/../".to_string(), None),
    ] {
        let (s, _) = h.api(method, &path, body).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{method} {path}");
    }
}

/// Every documented operation (plus the document and its page) at `path`, each path parameter
/// filled in: `{session_id}` with `session`, `{process_id}` with an id no process has.
fn every_operation(session: &str) -> Vec<(&'static str, String)> {
    use utoipa::OpenApi;
    let doc = control_plane::routes::openapi::ApiDoc::openapi();
    let mut ops = vec![
        ("GET", "/openapi.json".to_string()),
        ("GET", "/docs".to_string()),
    ];
    for (path, item) in &doc.paths.paths {
        let path = path
            .replace("{session_id}", session)
            .replace("{process_id}", "p1-0000");
        for (method, present) in [
            ("GET", item.get.is_some()),
            ("POST", item.post.is_some()),
            ("PUT", item.put.is_some()),
            ("DELETE", item.delete.is_some()),
        ] {
            if present {
                ops.push((method, path.clone()));
            }
        }
    }
    ops
}

#[tokio::test]
async fn every_route_answers_with_and_without_the_prefix_and_its_trailing_slash() {
    // DAIV's documented URL (`http://sandbox:8000`) has no prefix; the reference serves both
    // (FastAPI's `root_path`). A route missing in one form answers the router's empty 404.
    let h = Harness::default();
    let ghost = "e".repeat(64);
    let ops = every_operation(&ghost);
    assert!(ops.len() >= 22, "{ops:?}");
    for (method, path) in ops {
        let bare = path.trim_end_matches('/').to_string();
        let slashed = format!("{bare}/");
        let forms = [
            bare.clone(),
            slashed.clone(),
            format!("/api/v1{bare}"),
            format!("/api/v1{slashed}"),
        ];
        // `/docs` and `/openapi.json` are files: no trailing slash.
        let forms = if path.ends_with("docs") || path.ends_with(".json") {
            vec![forms[0].clone(), forms[2].clone()]
        } else {
            forms.to_vec()
        };
        let mut answers = Vec::new();
        for uri in &forms {
            let resp = h
                .send(
                    axum::http::Request::builder()
                        .method(method)
                        .uri(uri)
                        .header("x-api-key", harness::KEY)
                        .body(axum::body::Body::empty())
                        .expect("request"),
                )
                .await;
            let status = resp.status();
            let bytes = http_body_util::BodyExt::collect(resp.into_body())
                .await
                .expect("body")
                .to_bytes();
            assert!(
                !bytes.is_empty() && status != StatusCode::METHOD_NOT_ALLOWED,
                "{method} {uri}: {status}, no handler answered"
            );
            answers.push(status);
        }
        assert!(
            answers.iter().all(|s| *s == answers[0]),
            "{method} {path}: {answers:?} across {forms:?}"
        );
    }
}

#[tokio::test]
async fn a_whole_turn_works_on_the_bare_routes_with_the_key_still_required() {
    let h = Harness::default();
    let (s, _) = h
        .call(
            "POST",
            "/session/",
            Some(json!({"base_image": harness::IMAGE})),
            None,
        )
        .await;
    assert_eq!(s, StatusCode::FORBIDDEN);
    let (s, b) = h
        .call(
            "POST",
            "/session",
            Some(json!({"base_image": harness::IMAGE})),
            Some(harness::KEY),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let id = b["session_id"].as_str().expect("id").to_string();
    let call = |method: &'static str, path: String, body: Option<Value>| {
        let h = &h;
        async move { h.call(method, &path, body, Some(harness::KEY)).await }
    };
    let (s, b) = call(
        "POST",
        format!("/session/{id}/"),
        Some(json!({"commands": ["echo bare"]})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(b["results"][0]["output"], "bare\n");
    let (s, b) = call(
        "POST",
        format!("/session/{id}/fs/write"),
        Some(json!({"path": "/workspace/repo/a.txt", "content": "aGk="})),
    )
    .await;
    assert_eq!((s, &b["ok"]), (StatusCode::OK, &json!(true)), "{b}");
    let (s, b) = call(
        "POST",
        format!("/session/{id}/fs/read"),
        Some(json!({"path": "/workspace/repo/a.txt"})),
    )
    .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert!(b["content"].as_str().unwrap_or("").contains("hi"), "{b}");
    let (s, _) = call("GET", format!("/session/{id}"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = call("DELETE", format!("/session/{id}/?force=true"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, _) = call("GET", format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

// Commands run through the real helper (a host build, in a per-container temp directory):
// these tests drive the runtime's channel and protocol in-process.

#[tokio::test]
async fn commands_run_in_order_and_fail_fast_stops_at_the_first_failure() {
    let h = Harness::default();
    let id = h.session().await;
    let cmds = json!(["echo one", "echo bad; exit 2", "echo three"]);
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": cmds})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let results = b["results"].as_array().expect("results");
    assert_eq!(results.len(), 3);
    // Each result says what its command cost (additive fields DAIV's schema allows); a command
    // over before the helper's first sample may have no memory figure.
    let mut second = results[1].clone();
    for field in ["duration_ms", "cpu_ms", "max_rss_bytes"] {
        let v = second.as_object_mut().and_then(|o| o.remove(field));
        match v {
            Some(v) => assert!(v.is_u64(), "{field}: {v}"),
            None => assert_eq!(
                field, "max_rss_bytes",
                "{field} missing from {}",
                results[1]
            ),
        }
    }
    assert_eq!(
        second,
        json!({"command": "echo bad; exit 2", "output": "bad\n", "exit_code": 2, "workdir": "/workspace/repo"})
    );
    let (_, b) = h
        .api(
            "POST",
            &format!("/session/{id}"),
            Some(json!({"commands": cmds, "fail_fast": true})),
        )
        .await;
    let results = b["results"].as_array().expect("results");
    assert_eq!(results.len(), 2);
    assert_eq!(results[1]["exit_code"], 2);
}

#[tokio::test]
async fn a_request_keeps_at_most_its_output_budget_over_all_its_commands() {
    let h = Harness::new(
        FakeEngine::default(),
        &[
            ("OUTPUT_MAX_BYTES", "800"),
            ("RUN_OUTPUT_MAX_BYTES", "1000"),
        ],
    );
    let id = h.session().await;
    let print = "head -c 600 /dev/zero | tr '\\0' x";
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": [print, print, print]})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let kept: Vec<usize> = (0..3)
        .map(|i| {
            b["results"][i]["output"]
                .as_str()
                .unwrap_or_default()
                .split("\n[daiv-sandbox")
                .next()
                .unwrap_or_default()
                .matches('x')
                .count()
        })
        .collect();
    assert_eq!(kept, [600, 400, 0], "{b}");
    for (i, omitted) in [(1, 200), (2, 600)] {
        let out = b["results"][i]["output"].as_str().unwrap_or_default();
        assert!(
            out.contains(&format!("{omitted} bytes omitted"))
                && out.contains("800 bytes per command and 1000 per request"),
            "{out}"
        );
    }
    assert_eq!(b["results"][2]["exit_code"], 0);
}

#[tokio::test]
async fn a_timed_out_command_is_killed_reports_124_and_skips_the_rest() {
    let h = Harness::default();
    let id = h.session().await;
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["echo ok", "echo partial; sleep 30", "echo never"], "timeout": 1})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let results = b["results"].as_array().expect("results");
    assert_eq!(results.len(), 2, "{b}");
    assert_eq!(results[1]["exit_code"], 124);
    assert_eq!(results[1]["output"], "partial\n");
}

#[tokio::test]
async fn out_of_range_timeouts_and_cpus_are_refused() {
    let h = Harness::default();
    let id = h.session().await;
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["true"], "timeout": u64::MAX})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "img:1", "cpus": 1e-10})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
}

#[tokio::test]
async fn the_server_default_timeout_applies_and_zero_disables_it() {
    let h = Harness::new(FakeEngine::default(), &[("COMMAND_TIMEOUT", "1")]);
    let id = h.session().await;
    let (_, b) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["sleep 30"]})),
        )
        .await;
    assert_eq!(b["results"][0]["exit_code"], 124);
    let (_, b) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["sleep 1.5; echo slept"], "timeout": 0})),
        )
        .await;
    assert_eq!(
        b["results"][0]["exit_code"], 0,
        "timeout 0 must not time out: {b}"
    );
    assert_eq!(b["results"][0]["output"], "slept\n");
}

#[tokio::test]
async fn a_busy_session_answers_409_after_the_lock_wait() {
    let h = Arc::new(Harness::new(
        FakeEngine::default(),
        &[("SESSION_LOCK_WAIT_SECONDS", "0.2")],
    ));
    let id = h.session().await;
    let h2 = h.clone();
    let id2 = id.clone();
    let slow = tokio::spawn(async move {
        h2.api(
            "POST",
            &format!("/session/{id2}/"),
            Some(json!({"commands": ["sleep 1"], "timeout": 5})),
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["true"]})),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    let (s, _) = h.api("DELETE", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _) = slow.await.expect("join");
    assert_eq!(s, StatusCode::OK);
    let (s, _) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["true"]})),
        )
        .await;
    assert_eq!(s, StatusCode::OK);
}

#[tokio::test]
async fn a_force_delete_does_not_wait_behind_a_busy_session() {
    let h = Harness::new(
        FakeEngine::default(),
        &[("SESSION_LOCK_WAIT_SECONDS", "30")],
    );
    let id = h.session().await;
    let path = format!("/session/{id}/");
    let runner = {
        let (h, path) = (h.router.clone(), path.clone());
        tokio::spawn(async move {
            let req = axum::http::Request::builder()
                .method("POST")
                .uri(format!("/api/v1{path}"))
                .header("x-api-key", harness::KEY)
                .header("content-type", "application/json")
                .body(axum::body::Body::from(
                    json!({"commands": ["sleep 60"]}).to_string(),
                ))
                .expect("request");
            tower::ServiceExt::oneshot(h, req).await
        })
    };
    // The run holds the session's lock for a minute; a stop would wait 30 s, then 409.
    for _ in 0..100 {
        if h.locks.acquire(&id, Duration::ZERO).await.is_err() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (s, b) = h.api("DELETE", &format!("{path}?force=true"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    assert_eq!(h.engine.status(&id), None);
    runner.abort();
}

#[tokio::test]
async fn close_stops_status_restarts_and_force_removes() {
    let h = Harness::default();
    let id = h.session().await;
    let (s, _) = h.api("DELETE", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(h.engine.status(&id), Some(ContainerStatus::Exited));
    let (s, _) = h.api("GET", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(h.engine.status(&id), Some(ContainerStatus::Running));
    let (s, _) = h
        .api("DELETE", &format!("/session/{id}/?force=true"), None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(h.engine.status(&id), None);
    let (s, _) = h.api("GET", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
}

#[tokio::test]
async fn malformed_json_is_422_with_detail() {
    let h = Harness::default();
    let id = h.session().await;
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": "not-a-list"})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    assert!(b["detail"].is_string());
}

/// `docs/openapi.json` is the document the service serves (with the default settings), so a
/// reader of the repository and a generator of clients see the API without running it.
/// `UPDATE_OPENAPI=1 cargo nextest run -p control-plane openapi` writes it anew.
#[tokio::test]
async fn the_checked_in_openapi_document_is_the_served_one() {
    let h = Harness::default();
    let (s, served) = h.call("GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    let text = serde_json::to_string_pretty(&served).expect("json") + "\n";
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &text).expect("write docs/openapi.json");
    }
    let checked_in = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        checked_in == text,
        "docs/openapi.json differs from the served document: run \
         `UPDATE_OPENAPI=1 cargo nextest run -p control-plane openapi` and commit it"
    );
}

#[tokio::test]
async fn openapi_documents_every_route() {
    let h = Harness::default();
    let (s, b) = h.call("GET", "/api/v1/openapi.json", None, None).await;
    assert_eq!(s, StatusCode::OK);
    for path in [
        "/session/",
        "/session/{session_id}/",
        "/-/health/",
        "/-/version/",
    ] {
        assert!(b["paths"].get(path).is_some(), "{path} missing");
    }
    assert_eq!(b["servers"][0]["url"], "/api/v1");
    assert!(b["components"]["schemas"].get("RunResult").is_some());
    // What the docs page's "Authorize" applies, and to which operations: all but the open ones.
    let scheme = &b["components"]["securitySchemes"]["api_key"];
    assert_eq!(
        (&scheme["type"], &scheme["in"], &scheme["name"]),
        (&json!("apiKey"), &json!("header"), &json!("X-API-Key"))
    );
    for (path, item) in b["paths"].as_object().expect("paths") {
        for (method, op) in item.as_object().expect("path item") {
            let open = path.starts_with("/-/");
            let keyed = op["security"] == json!([{"api_key": []}]);
            assert_eq!(keyed, !open, "{method} {path}: security {}", op["security"]);
        }
    }
}

/// `/docs` is Swagger UI whose every file comes from the service itself, under a policy that
/// allows nothing else; at the root and under the prefix, with no key.
#[tokio::test]
async fn docs_page_and_every_file_it_loads_come_from_the_service() {
    use control_plane::routes::docs::CONTENT_SECURITY_POLICY;
    let h = Harness::default();
    for base in ["", "/api/v1"] {
        let resp = h.send(get(&format!("{base}/docs"))).await;
        assert_eq!(resp.status(), StatusCode::OK, "{base}/docs");
        let csp = header(&resp, "content-security-policy");
        assert_eq!(csp, CONTENT_SECURITY_POLICY);
        assert!(csp.contains("script-src 'self';") && csp.contains("default-src 'none'"));
        assert!(!csp.contains("unsafe") && !csp.contains("http"), "{csp}");
        assert_eq!(header(&resp, "content-type"), "text/html; charset=utf-8");
        let page = text(resp).await;
        let files: Vec<&str> = page
            .split(['"', '\''])
            .filter(|s| s.starts_with("docs/"))
            .collect();
        assert!(
            !page.contains("http") && !page.contains("<script>"),
            "{page}"
        );
        for file in [
            "docs/swagger-ui-bundle.js",
            "docs/swagger-ui.css",
            "docs/init.js",
        ] {
            assert!(
                files.contains(&file),
                "{file} not loaded by the page: {page}"
            );
        }
        for file in files.iter().chain(&["docs/LICENSE"]) {
            let resp = h.send(get(&format!("{base}/{file}"))).await;
            assert_eq!(resp.status(), StatusCode::OK, "{base}/{file}");
            let expected = match file.rsplit('.').next() {
                Some("js") => "text/javascript; charset=utf-8",
                Some("css") => "text/css; charset=utf-8",
                Some("png") => "image/png",
                _ => "text/plain; charset=utf-8",
            };
            assert_eq!(header(&resp, "content-type"), expected, "{file}");
            assert_eq!(header(&resp, "x-content-type-options"), "nosniff");
            let body = text(resp).await;
            match *file {
                "docs/swagger-ui-bundle.js" => assert!(body.contains("SwaggerUIBundle")),
                "docs/init.js" => {
                    assert!(
                        body.contains("\"openapi.json\"") && body.contains("validatorUrl: null")
                    )
                }
                "docs/LICENSE" => assert!(body.contains("Apache License")),
                _ => assert!(!body.is_empty(), "{file}"),
            }
        }
        // Relative names resolve from `/docs` only: `/docs/` sends the browser there.
        let resp = h.send(get(&format!("{base}/docs/"))).await;
        assert_eq!(resp.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(header(&resp, "location"), "../docs");
        let resp = h.send(get(&format!("{base}/docs/swagger-ui.js.map"))).await;
        assert_eq!(resp.status(), StatusCode::NOT_FOUND);
    }
}

fn get(uri: &str) -> axum::http::Request<axum::body::Body> {
    axum::http::Request::get(uri)
        .body(axum::body::Body::empty())
        .expect("request")
}

fn header(resp: &axum::http::Response<axum::body::Body>, name: &str) -> String {
    resp.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string()
}

async fn text(resp: axum::http::Response<axum::body::Body>) -> String {
    let bytes = http_body_util::BodyExt::collect(resp.into_body())
        .await
        .expect("body")
        .to_bytes();
    String::from_utf8_lossy(&bytes).into_owned()
}

// === egress sessions (in-process: what the control plane asks of the engine) ===

/// The egress harness's CA key (not a real key: the control plane only passes it on, and
/// derives the policy version key from it).
const TEST_CA_KEY: &str = "-----BEGIN PRIVATE KEY-----\nTEST-CA-KEY\n-----END PRIVATE KEY-----\n";

/// The version the control plane labels `file` with under the harness's CA key.
fn keyed_version(file: &shared_policy::PolicyFile) -> String {
    control_plane::egress::version::PolicyVersions::from_ca_key(TEST_CA_KEY.as_bytes())
        .label(file)
        .version
        .expect("labelled")
}

fn egress_harness(engine: FakeEngine) -> Harness {
    egress_harness_with(engine, &[])
}

fn egress_harness_with(engine: FakeEngine, extra: &[(&str, &str)]) -> Harness {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = std::env::temp_dir().join(format!("daiv-router-ca-{}-{n}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp");
    let cert = dir.join("ca.crt");
    let key = dir.join("ca.key");
    std::fs::write(
        &cert,
        "-----BEGIN CERTIFICATE-----\nTEST-CA-CERT\n-----END CERTIFICATE-----\n",
    )
    .expect("cert");
    std::fs::write(&key, TEST_CA_KEY).expect("key");
    let (cert, key) = (cert.display().to_string(), key.display().to_string());
    let mut settings = vec![
        ("EGRESS_CA_CERT_FILE", cert.as_str()),
        ("EGRESS_CA_KEY_FILE", key.as_str()),
    ];
    settings.extend_from_slice(extra);
    let h = Harness::new(engine, &settings);
    // The CA is read once, when the state is built: the files can go.
    let _ = std::fs::remove_dir_all(&dir);
    h
}

impl Harness {
    /// Creates an egress session (policy from [`egress_body`]) and returns its id.
    async fn egress_session(&self, secret: &str) -> String {
        let (s, b) = self
            .api(
                "POST",
                "/session/",
                Some(json!({"base_image": "img:1", "egress": egress_body(secret)})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{b}");
        b["session_id"].as_str().expect("id").to_string()
    }
}

fn egress_body(secret: &str) -> Value {
    json!({
        "policy": {"default": "deny", "rules": [{"host": "api.upstream.test", "methods": ["GET"], "inject": "tok"}]},
        "secrets": {"tok": {"header": "Authorization", "value": secret}}
    })
}

fn tar_text(spec: &control_plane::engine::ContainerSpec) -> String {
    String::from_utf8_lossy(
        &spec
            .skeleton_archive()
            .expect("readable")
            .unwrap_or_default(),
    )
    .into_owned()
}

#[tokio::test]
async fn egress_create_builds_the_triad_and_keeps_secrets_in_the_gateway() {
    let h = egress_harness(FakeEngine::default());
    let id = h.egress_session("s3cr3t-value").await;
    let sandbox = h.engine.spec(&id).expect("sandbox");
    let gateway_id = gateway_of(&h, &id);
    let gateway = h.engine.spec(&gateway_id).expect("gateway spec");
    // What the sandbox makes its gateway do is bounded: memory by default, logs on disk.
    assert_eq!(gateway.memory_bytes, Some(128 * 1024 * 1024));
    assert!(
        gateway
            .log_options
            .contains(&("max-size".to_string(), "10m".to_string()))
            && gateway.log_options.iter().any(|(k, _)| k == "max-file"),
        "{:?}",
        gateway.log_options
    );
    // The sandbox's internal network gives the host no address on it.
    assert!(
        h.engine
            .network_specs()
            .iter()
            .all(|n| !n.internal || n.no_host_address)
    );
    // The workspace is a volume and the helper keeps the container alive.
    assert_eq!(
        sandbox.volumes[..2],
        ["/workspace", control_plane::layout::SESSION_DIR]
    );
    assert_eq!(
        sandbox.cmd.as_deref().map(|c| &c[..2]),
        Some(
            &[
                "/.daiv-sandbox/daiv-sandbox-helper".to_string(),
                "init".to_string()
            ][..]
        )
    );

    // The sandbox: on the internal network only, at a fixed address, proxied, trusting the CA.
    let NetworkAttach::Network {
        name,
        ip: Some(sandbox_ip),
    } = &sandbox.network
    else {
        panic!("sandbox network: {:?}", sandbox.network);
    };
    assert!(h.engine.networks().contains(name));
    let proxy = sandbox
        .env
        .iter()
        .find(|(k, _)| k == "HTTPS_PROXY")
        .map(|(_, v)| v.clone())
        .expect("proxy");
    let gateway_ip = match sandbox_ip {
        std::net::IpAddr::V4(v4) => std::net::Ipv4Addr::from(u32::from(*v4) - 1),
        other => panic!("{other}"),
    };
    assert_eq!(proxy, format!("http://{gateway_ip}:8080"));
    assert!(
        sandbox
            .env
            .iter()
            .any(|(k, v)| k == "SSL_CERT_FILE" && v.ends_with("ca-bundle.pem"))
    );
    assert!(h.engine.attachments().contains(&(
        name.clone(),
        gateway_id.clone(),
        Some(std::net::IpAddr::V4(gateway_ip))
    )));
    // The gateway listens on its internal address only.
    assert!(
        gateway
            .env
            .contains(&("DAIV_EGRESS_LISTEN".into(), format!("{gateway_ip}:8080")))
    );

    // Secrets and the CA key exist in the gateway's files only.
    let sandbox_files = tar_text(&sandbox);
    let gateway_files = tar_text(&gateway);
    assert!(gateway_files.contains("s3cr3t-value") && gateway_files.contains("TEST-CA-KEY"));
    assert!(!sandbox_files.contains("s3cr3t-value") && !sandbox_files.contains("TEST-CA-KEY"));
    assert!(sandbox_files.contains("TEST-CA-CERT"));
    for (k, v) in sandbox.env.iter().chain(gateway.env.iter()) {
        assert!(!v.contains("s3cr3t-value") && !k.contains("s3cr3t-value"));
    }
    // The CA is installed and the gateway is ready before the session is handed out.
    let calls = h.engine.calls();
    assert!(
        calls
            .iter()
            .any(|c| c.starts_with(&format!("wait_for_log {gateway_id}")))
    );
    let start_gw = calls
        .iter()
        .position(|c| c == &format!("start {gateway_id}"))
        .expect("gateway started");
    let start_sb = calls
        .iter()
        .position(|c| c == &format!("start {id}"))
        .expect("sandbox started");
    assert!(start_gw < start_sb);
}

#[tokio::test]
async fn a_failure_part_way_tears_down_everything() {
    for failing in ["wait_for_log", "start ", "create img:1", "connect_network"] {
        let engine = FakeEngine::default();
        engine.fail_on(failing);
        let h = egress_harness(engine);
        let (s, b) = h
            .api(
                "POST",
                "/session/",
                Some(json!({"base_image": "img:1", "egress": egress_body("x")})),
            )
            .await;
        assert!(s.is_server_error(), "{failing}: {s} {b}");
        assert!(
            h.engine.container_ids().is_empty(),
            "{failing}: containers left"
        );
        assert!(h.engine.networks().is_empty(), "{failing}: networks left");
    }
}

/// The gateway image is pulled on demand; one that cannot be pulled answers the reference's 503
/// before any part of the triad exists.
#[tokio::test]
async fn an_unpullable_gateway_image_is_503_and_creates_nothing() {
    let engine = FakeEngine::default();
    engine.set_missing_image("registry.test/egress:1");
    let h = egress_harness_with(engine, &[("EGRESS_PROXY_IMAGE", "registry.test/egress:1")]);
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "img:1", "egress": egress_body("x")})),
        )
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    let detail = b["detail"].as_str().unwrap_or_default();
    assert!(
        detail.starts_with("Egress proxy failed to start: ")
            && detail.contains("registry.test/egress:1")
            && detail.contains("refused access for lack of valid credentials"),
        "{detail}"
    );
    let calls = h.engine.calls();
    assert!(
        calls
            .iter()
            .any(|c| c == "ensure_image registry.test/egress:1"),
        "{calls:?}"
    );
    // Neither a container nor a network (`create_network ...`) was made.
    assert!(!calls.iter().any(|c| c.starts_with("create")), "{calls:?}");
    assert!(h.engine.container_ids().is_empty());
    assert!(h.engine.networks().is_empty());
}

#[tokio::test]
async fn invalid_egress_policies_are_422_and_create_nothing() {
    let h = egress_harness(FakeEngine::default());
    for bad in [
        json!({"policy": {"default": "deny"}}),
        json!({"policy": {"rules": [{"host": "a.test", "inject": "missing"}]}}),
        json!({"policy": {"rules": [{"host": ""}]}}),
        json!("not an object"),
    ] {
        let (s, b) = h
            .api(
                "POST",
                "/session/",
                Some(json!({"base_image": "img:1", "egress": bad})),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    }
    assert!(h.engine.container_ids().is_empty());
    assert!(h.engine.networks().is_empty());
}

#[tokio::test]
async fn put_egress_answers_404_409_422_and_writes_the_gateway_only() {
    let h = egress_harness(FakeEngine::default());
    let (_, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "img:1", "egress": egress_body("old")})),
        )
        .await;
    let id = b["session_id"].as_str().expect("id").to_string();
    let plain = h.session().await;
    let ghost = "e".repeat(64);
    let (s, _) = h
        .api(
            "PUT",
            &format!("/session/{ghost}/egress/"),
            Some(egress_body("n")),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    let (s, _) = h
        .api(
            "PUT",
            &format!("/session/{plain}/egress"),
            Some(egress_body("n")),
        )
        .await;
    assert_eq!(s, StatusCode::CONFLICT);
    let (s, _) = h
        .api(
            "PUT",
            &format!("/session/{id}/egress/"),
            Some(json!({"policy": {"rules": [{"host": " "}]}})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
    let before = h.engine.calls().len();
    let (s, b) = h
        .api(
            "PUT",
            &format!("/session/{id}/egress/"),
            Some(egress_body("new")),
        )
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let calls = h.engine.calls()[before..].to_vec();
    let puts: Vec<_> = calls
        .iter()
        .filter(|c| c.starts_with("put_archive"))
        .collect();
    assert_eq!(puts.len(), 1, "{calls:?}");
    assert!(
        !puts[0].contains(&id),
        "the policy goes to the gateway, never the sandbox"
    );
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("start") || c.starts_with("stop")),
        "no restart: {calls:?}"
    );
}

#[tokio::test]
async fn egress_close_stops_both_and_resume_starts_the_gateway_first() {
    let h = egress_harness(FakeEngine::default());
    let (_, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "img:1", "egress": egress_body("x")})),
        )
        .await;
    let id = b["session_id"].as_str().expect("id").to_string();
    let gateway = gateway_of(&h, &id);
    let (s, _) = h.api("DELETE", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(h.engine.status(&gateway), Some(ContainerStatus::Exited));
    assert_eq!(h.engine.status(&id), Some(ContainerStatus::Exited));
    let before = h.engine.calls().len();
    let (s, _) = h.api("GET", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let calls = h.engine.calls()[before..].to_vec();
    let gw = calls
        .iter()
        .position(|c| c == &format!("start {gateway}"))
        .expect("gateway restarted");
    let sb = calls
        .iter()
        .position(|c| c == &format!("start {id}"))
        .expect("sandbox restarted");
    assert!(gw < sb, "{calls:?}");
    let (s, _) = h
        .api("DELETE", &format!("/session/{id}/?force=true"), None)
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert!(h.engine.container_ids().is_empty());
    assert!(h.engine.networks().is_empty());
}

#[tokio::test]
async fn a_restart_that_fails_is_503() {
    let h = Harness::default();
    let id = h.session().await;
    let (s, _) = h.api("DELETE", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    h.engine.fail_on(&format!("start {id}"));
    let (s, b) = h.api("GET", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    assert!(
        b["detail"]
            .as_str()
            .unwrap_or("")
            .contains("could not be restarted"),
        "{b}"
    );
    let (s, _) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["true"]})),
        )
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE);
}

/// Unauthenticated clients choose the method token: it must not become a new metrics series or
/// a kilobyte-long log field per request.
#[tokio::test]
async fn custom_methods_do_not_grow_the_metrics() {
    let h = Harness::new(FakeEngine::default(), &[("METRICS_PUBLIC", "true")]);
    for i in 0..50 {
        let method = format!("X{i}{}", "A".repeat(4096));
        let _ = h.call(&method, "/api/v1/session/", None, None).await;
    }
    let (status, body) = h.call("GET", "/metrics", None, None).await;
    assert_eq!(status, StatusCode::OK);
    let text = body.as_str().unwrap_or_default().to_string();
    assert!(text.contains("method=\"OTHER\""), "{text}");
    assert!(!text.contains("AAAA"), "raw methods reached the metrics");
    assert!(
        text.len() < 64 * 1024,
        "metrics grew to {} bytes",
        text.len()
    );
}

// === egress policy installs: versioned, staged, acknowledged (the sidecar contract) ===

/// A container's config is what `docker commit` keeps twice in a snapshot's image (its config,
/// and the committing container's own as `container_config`): the caller's `environment` is in
/// none of it, for an isolated session or an egress one. It is the session's environment file,
/// on a volume of the session's own (which no commit keeps), and commands see it there.
#[tokio::test]
async fn the_callers_environment_is_in_no_containers_config_only_its_session_file() {
    let value = "caller-value-3e9b1d";
    let h = egress_harness(FakeEngine::default());
    let env = json!({"CALLER_VAR": value, "HTTPS_PROXY": "http://caller.test:1"});
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "img:1", "environment": env})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let isolated = b["session_id"].as_str().expect("id").to_string();
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(
                json!({"base_image": "img:1", "environment": env, "egress": egress_body("s3cr3t")}),
            ),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let egress = b["session_id"].as_str().expect("id").to_string();
    for id in h.engine.container_ids() {
        let spec = h.engine.spec(&id).expect("spec");
        let config = format!(
            "{:?} {:?} {:?} {:?} {:?}",
            spec.env, spec.labels, spec.cmd, spec.entrypoint, spec.name
        );
        assert!(!config.contains(value), "{id}: {config}");
        assert!(!config.contains("caller.test"), "{id}: {config}");
    }
    for (id, expected) in [
        (
            &isolated,
            format!(r#"[["CALLER_VAR","{value}"],["HTTPS_PROXY","http://caller.test:1"]]"#),
        ),
        // The egress settings win: the caller's proxy is not in an egress session's file.
        (&egress, format!(r#"[["CALLER_VAR","{value}"]]"#)),
    ] {
        let spec = h.engine.spec(id).expect("spec");
        assert!(
            spec.volumes
                .iter()
                .any(|v| v == control_plane::layout::SESSION_DIR),
            "{:?}",
            spec.volumes
        );
        let file = h
            .engine
            .file(id, control_plane::layout::ENV_FILE)
            .expect("env file");
        assert_eq!(String::from_utf8_lossy(&file), expected);
        let (s, ran) = h
            .api(
                "POST",
                &format!("/session/{id}/"),
                Some(json!({"commands": ["printf %s \"$CALLER_VAR\""]})),
            )
            .await;
        assert_eq!(s, StatusCode::OK, "{ran}");
        assert_eq!(ran["results"][0]["output"], json!(value));
    }
}

fn gateway_of(h: &Harness, sandbox: &str) -> String {
    h.engine
        .container_ids()
        .into_iter()
        .find(|c| c != sandbox)
        .expect("gateway")
}

/// The tar entries of a skeleton: (path, uid, content).
fn tar_entries(tar_bytes: &[u8]) -> Vec<(String, u64, Vec<u8>)> {
    let mut archive = tar::Archive::new(tar_bytes);
    archive
        .entries()
        .expect("entries")
        .map(|e| {
            let mut e = e.expect("entry");
            let path = e.path().expect("path").display().to_string();
            let uid = e.header().uid().expect("uid");
            let mut data = Vec::new();
            std::io::Read::read_to_end(&mut e, &mut data).expect("read");
            (path, uid, data)
        })
        .collect()
}

/// The contract test, control-plane side: the gateway is configured with exactly the names of
/// `shared_policy::sidecar`, and the policy it is given reads back the way the gateway reads it
/// (`Evaluator::from_json`), labelled with its content version; create waits for that version.
#[tokio::test]
async fn egress_create_writes_the_sidecar_contract_and_acknowledges_the_policy() {
    use shared_policy::sidecar;
    let h = egress_harness(FakeEngine::default());
    let id = h.egress_session("s3cr3t").await;
    let gateway_id = gateway_of(&h, &id);
    let gateway = h.engine.spec(&gateway_id).expect("gateway spec");
    let env: std::collections::HashMap<_, _> = gateway.env.iter().cloned().collect();
    assert_eq!(env[sidecar::env::POLICY_FILE], sidecar::DEFAULT_POLICY_PATH);
    assert_eq!(
        env[sidecar::env::CA_CERT_FILE],
        sidecar::DEFAULT_CA_CERT_PATH
    );
    assert_eq!(env[sidecar::env::CA_KEY_FILE], sidecar::DEFAULT_CA_KEY_PATH);
    assert!(env.contains_key(sidecar::env::LISTEN) && env.contains_key(sidecar::env::SESSION_ID));
    // The acknowledgement's listener is the gateway's own loopback, never its proxy address.
    assert_eq!(
        env[sidecar::env::HEALTH_LISTEN],
        sidecar::DEFAULT_HEALTH_LISTEN
    );
    assert!(env[sidecar::env::HEALTH_LISTEN].starts_with("127."));
    assert!(
        !env.contains_key(sidecar::env::PLAIN_HTTP_HOSTS),
        "off by default"
    );
    for name in env.keys() {
        assert!(name.starts_with("DAIV_EGRESS_"), "{name}");
    }
    let entries = tar_entries(
        &gateway
            .skeleton_archive()
            .expect("readable")
            .expect("skeleton"),
    );
    let policy_entry = sidecar::DEFAULT_POLICY_PATH.trim_start_matches('/');
    let (_, uid, policy) = entries
        .iter()
        .find(|(p, _, _)| p == policy_entry)
        .expect("policy in the skeleton");
    assert!(
        entries
            .iter()
            .all(|(_, uid, _)| *uid == u64::from(sidecar::UID))
    );
    assert_eq!(*uid, u64::from(sidecar::UID));
    let evaluator = shared_policy::Evaluator::from_json(policy).expect("the gateway reads it");
    let file: shared_policy::PolicyFile = serde_json::from_slice(policy).expect("json");
    let version = evaluator.version().expect("versioned").to_owned();
    assert_eq!(version, keyed_version(&file));
    let host = shared_policy::Host::parse("api.upstream.test").expect("host");
    assert!(evaluator.decide_request(&host, "GET").inject.is_some());
    // Ready, then acknowledged: the gateway's own health check ran inside the gateway.
    let calls = h.engine.calls();
    let ready = calls
        .iter()
        .position(|c| c.starts_with(&format!("wait_for_log {gateway_id}")))
        .expect("ready wait");
    let ack = calls
        .iter()
        .position(|c| c == &format!("exec {gateway_id} {version}"))
        .unwrap_or_else(|| panic!("no acknowledgement: {calls:?}"));
    assert!(ready < ack, "{calls:?}");
}

#[tokio::test]
async fn put_egress_stages_the_policy_and_answers_204_only_once_acknowledged() {
    use shared_policy::sidecar;
    // The fake gateway acknowledges the create's version and the first update, then stops.
    let acks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let engine = {
        let acks = acks.clone();
        FakeEngine::new(move |cmd| {
            let ok = !cmd.starts_with(control_plane::egress::version::VERSION_PREFIX)
                || acks.fetch_add(1, std::sync::atomic::Ordering::SeqCst) < 2;
            control_plane::engine::fake::FakeExec {
                chunks: vec![format!("ack {cmd}\n").into_bytes()],
                exit_code: if ok { 0 } else { 1 },
            }
        })
    };
    let h = egress_harness(engine);
    let (_, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "img:1", "egress": egress_body("old")})),
        )
        .await;
    let id = b["session_id"].as_str().expect("id").to_string();
    let gateway_id = gateway_of(&h, &id);
    // The agent cannot choose the version (it is the content's) nor turn on report-only mode.
    let mut body = egress_body("new");
    body["version"] = json!("agent-chosen");
    let before = h.engine.calls().len();
    let (s, b) = h
        .api("PUT", &format!("/session/{id}/egress/"), Some(body))
        .await;
    assert_eq!(s, StatusCode::NO_CONTENT, "{b}");
    let staged = h
        .engine
        .file(
            &gateway_id,
            &sidecar::config_path(sidecar::POLICY_STAGING_FILE),
        )
        .expect("staged policy written");
    let file: shared_policy::PolicyFile = serde_json::from_slice(&staged).expect("json");
    let version = file.version.clone().expect("versioned");
    assert_eq!(version, keyed_version(&file));
    assert_eq!(file.secrets["tok"].value.expose(), "new");
    let calls = h.engine.calls()[before..].to_vec();
    let put = calls
        .iter()
        .position(|c| c.starts_with(&format!("put_archive {gateway_id}")))
        .expect("put");
    let ack = calls
        .iter()
        .position(|c| c == &format!("exec {gateway_id} {version}"))
        .unwrap_or_else(|| panic!("no acknowledgement: {calls:?}"));
    assert!(put < ack, "{calls:?}");
    // The live file is the create's skeleton's, never extracted over.
    let live = h
        .engine
        .file(&gateway_id, &sidecar::config_path(sidecar::POLICY_FILE))
        .map(|f| serde_json::from_slice::<shared_policy::PolicyFile>(&f).expect("json"));
    assert!(
        live.is_some_and(|f| f.secrets["tok"].value.expose() == "old"),
        "the live file is never extracted over: {calls:?}"
    );

    let mut shadow = egress_body("x");
    shadow["policy"]["mode"] = json!("shadow");
    let (s, b) = h
        .api("PUT", &format!("/session/{id}/egress/"), Some(shadow))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(b.to_string().contains("shadow"), "{b}");

    // A gateway that does not report the new version: 503, not 204.
    let (s, b) = h
        .api(
            "PUT",
            &format!("/session/{id}/egress/"),
            Some(egress_body("newer")),
        )
        .await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{b}");
    assert!(b.to_string().contains("did not enforce"), "{b}");
}

#[tokio::test]
async fn path_rules_pass_the_api() {
    let h = egress_harness(FakeEngine::default());
    let body = json!({
        "policy": {"default": "deny", "rules": [{"host": "gitlab.upstream.test", "paths": ["/api/v4/projects/**"], "inject": "tok"}]},
        "secrets": {"tok": {"header": "PRIVATE-TOKEN", "value": "glpat"}}
    });
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "img:1", "egress": body})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    let bad = json!({"policy": {"rules": [{"host": "a.test", "paths": ["no-slash"]}]}});
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "img:1", "egress": bad})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(b.to_string().contains("paths"), "{b}");
}

/// `DAIV_SANDBOX_EGRESS_PLAIN_HTTP_HOSTS` reaches the gateway (normalised), and the sandbox
/// knows nothing of it; the policy body has no say in it.
#[tokio::test]
async fn the_plain_http_opt_in_is_a_setting_that_reaches_the_gateway_only() {
    let h = egress_harness_with(
        FakeEngine::default(),
        &[("EGRESS_PLAIN_HTTP_HOSTS", "GitLab:8929")],
    );
    let id = h.egress_session("tok").await;
    let gateway = h.engine.spec(&gateway_of(&h, &id)).expect("gateway spec");
    assert!(
        gateway.env.contains(&(
            "DAIV_EGRESS_PLAIN_HTTP_HOSTS".to_string(),
            "gitlab:8929".to_string()
        )),
        "{:?}",
        gateway.env
    );
    let sandbox = h.engine.spec(&id).expect("sandbox");
    assert!(sandbox.env.iter().all(|(_, v)| !v.contains("gitlab")));
}

/// Issue 25 item 9: a secret value that is not a header value would fail every request it is
/// injected into; it is a 422 at create and at `PUT .../egress/`, and the answer never echoes it.
#[tokio::test]
async fn secret_values_that_are_not_header_values_are_422_and_never_echoed() {
    let h = egress_harness(FakeEngine::default());
    let bad = egress_body("glpat-s3cr3t\u{7}value");
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"base_image": "img:1", "egress": bad.clone()})),
        )
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    let text = b.to_string();
    assert!(text.contains("secrets.tok.value"), "{text}");
    assert!(!text.contains("s3cr3t"), "{text}");
    assert!(h.engine.container_ids().is_empty());
    assert!(h.engine.networks().is_empty());

    let id = h.egress_session("good").await;
    let gateway_id = gateway_of(&h, &id);
    let (s, b) = h
        .api("PUT", &format!("/session/{id}/egress/"), Some(bad))
        .await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{b}");
    assert!(!b.to_string().contains("s3cr3t"), "{b}");
    use shared_policy::sidecar;
    assert!(
        h.engine
            .file(
                &gateway_id,
                &sidecar::config_path(sidecar::POLICY_STAGING_FILE)
            )
            .is_none(),
        "nothing was written"
    );
}

/// `DAIV_SANDBOX_EGRESS_UPSTREAM_PROXY` reaches the gateway (only): its egress goes through the
/// operator's proxy, and the sandbox never sees the proxy's credentials.
#[tokio::test]
async fn the_upstream_proxy_setting_reaches_the_gateway_only() {
    let proxy = "http://user:pw@corp-proxy.test:3128";
    let h = egress_harness_with(FakeEngine::default(), &[("EGRESS_UPSTREAM_PROXY", proxy)]);
    let id = h.egress_session("tok").await;
    let gateway_id = gateway_of(&h, &id);
    let gateway = h.engine.spec(&gateway_id).expect("gateway spec");
    assert!(
        gateway
            .env
            .contains(&("DAIV_EGRESS_UPSTREAM_PROXY".to_string(), proxy.to_string())),
        "{:?}",
        gateway.env
    );
    let sandbox = h.engine.spec(&id).expect("sandbox");
    assert!(sandbox.env.iter().all(|(_, v)| !v.contains("pw@")));
}

#[tokio::test]
async fn pause_freezes_and_any_request_thaws_a_stopped_session_is_409() {
    let h = Harness::default();
    let id = h.session().await;
    let (s, _) = h.api("POST", &format!("/session/{id}/pause/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(h.engine.status(&id), Some(ContainerStatus::Paused));
    // Pausing a paused session changes nothing.
    let (s, _) = h.api("POST", &format!("/session/{id}/pause/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    // Status answers 204 and thaws, as it restarts a stopped session.
    let (s, _) = h.api("GET", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    assert_eq!(h.engine.status(&id), Some(ContainerStatus::Running));
    // A command thaws it too.
    let (s, _) = h.api("POST", &format!("/session/{id}/pause/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, b) = h
        .api(
            "POST",
            &format!("/session/{id}/"),
            Some(json!({"commands": ["true"]})),
        )
        .await;
    assert_eq!(s, StatusCode::OK, "{b}");
    assert_eq!(h.engine.status(&id), Some(ContainerStatus::Running));
    // A stopped session has nothing to freeze.
    let (s, _) = h.api("DELETE", &format!("/session/{id}/"), None).await;
    assert_eq!(s, StatusCode::NO_CONTENT);
    let (s, b) = h.api("POST", &format!("/session/{id}/pause/"), None).await;
    assert_eq!(s, StatusCode::CONFLICT, "{b}");
    assert_eq!(h.engine.status(&id), Some(ContainerStatus::Exited));
}

#[tokio::test]
async fn snapshot_and_fork_requests_are_checked_before_anything_is_frozen() {
    let h = Harness::default();
    let id = h.session().await;
    for (path, body) in [
        ("snapshot", json!({"name": ""})),
        ("snapshot", json!({"ttl_seconds": 0})),
        ("snapshot", json!({"name": 5})),
        ("fork", json!({"count": 0})),
        ("fork", json!({"count": 17})),
        ("fork", json!({})),
    ] {
        let (s, b) = h
            .api(
                "POST",
                &format!("/session/{id}/{path}/"),
                Some(body.clone()),
            )
            .await;
        assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY, "{path} {body}: {b}");
        assert_eq!(h.engine.status(&id), Some(ContainerStatus::Running));
    }
    // Snapshot ids that cannot exist, and a create from one, are 404.
    for path in [
        "/snapshots/nope/",
        &format!("/snapshots/{}/", "0".repeat(32)),
    ] {
        let (s, _) = h.api("GET", path, None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
        let (s, _) = h.api("DELETE", path, None).await;
        assert_eq!(s, StatusCode::NOT_FOUND, "{path}");
    }
    let (s, b) = h
        .api(
            "POST",
            "/session/",
            Some(json!({"snapshot_id": "0".repeat(32)})),
        )
        .await;
    assert_eq!(s, StatusCode::NOT_FOUND, "{b}");
    // Neither an image nor a snapshot: refused.
    let (s, _) = h.api("POST", "/session/", Some(json!({}))).await;
    assert_eq!(s, StatusCode::UNPROCESSABLE_ENTITY);
}
