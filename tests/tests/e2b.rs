//! E2B's Python SDK, unchanged, against the service's E2B API (`DAIV_SANDBOX_E2B_PORT`): the
//! oldest and the newest supported `e2b` (pinned in integration/python/e2b-*.txt, each in its own
//! venv from scripts/ensure-python-venv.sh) run the programs of integration/python/e2b_driver.py
//! with only E2B_API_KEY, E2B_API_URL and E2B_SANDBOX_URL pointing here, and each test asserts on
//! what the program saw and on what Docker shows afterwards.

use std::path::PathBuf;

use anyhow::{Context, Result};
use e2e::egress::EgressStack;
use e2e::python::{drive_script, venv_python};
use e2e::{
    ControlPlane, DEBIAN, DeploymentGuard, containers_but_workers, free_port, require_image,
};
use serde_json::{Value, json};

const NEWEST: &str = "e2b-2.63.0";
const OLDEST: &str = "e2b-2.45.1";

/// The venv's python for `sdk` (e2b-VERSION).
fn python(sdk: &str) -> PathBuf {
    venv_python(Some(sdk))
}

/// A service with its E2B API on a port of its own.
struct E2bService {
    cp: ControlPlane,
    url: String,
}

async fn service(extra: &[(&str, &str)]) -> Result<E2bService> {
    require_image(DEBIAN);
    let port = free_port().to_string();
    let mut env: Vec<(&str, &str)> = vec![("E2B_PORT", &port)];
    env.extend_from_slice(extra);
    let cp = ControlPlane::start_with(&env).await?;
    Ok(E2bService {
        url: format!("http://127.0.0.1:{port}"),
        cp,
    })
}

/// Runs `scenario` of e2b_driver.py with `sdk` against `url`; the JSON it printed.
async fn drive(sdk: &str, url: &str, key: &str, scenario: &str, params: Value) -> Result<Value> {
    let env = [
        ("E2B_API_KEY", key.to_string()),
        ("E2B_API_URL", url.to_string()),
        ("E2B_SANDBOX_URL", url.to_string()),
        // The older SDKs check the key's shape (e2b_<hex>); the service's keys are its own.
        ("E2B_VALIDATE_API_KEY", "false".to_string()),
        ("E2B_PARAMS", params.to_string()),
    ];
    let env = env.map(|(k, v)| (k.to_string(), v)).to_vec();
    drive_script(python(sdk), "e2b_driver.py", scenario, env).await
}

/// Nothing of the deployment left running once the program killed its sandboxes.
fn assert_nothing_left(cp: &ControlPlane) {
    let label = format!("daiv.sandbox.deployment={}", cp.deployment);
    let left = containers_but_workers(&[&label]);
    assert!(left.is_empty(), "containers left: {left:?}");
}

async fn a_turn(sdk: &str, extra: &[(&str, &str)]) -> Result<()> {
    let svc = service(extra).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let tag = format!("turn-{}", free_port());
    let v = drive(sdk, &svc.url, &svc.cp.key, "turn", json!({ "tag": tag })).await?;
    let id = v["id"].as_str().context("id")?;
    let gvisor = extra.contains(&("RUNTIME", "runsc"));
    assert_eq!(
        v["kernel_log"]
            .as_str()
            .is_some_and(|l| l.contains("gVisor")),
        gvisor,
        "the sandbox ran under the runtime asked for: {v}"
    );

    // Commands: the environment, both streams apart, the home as the directory, the run uid.
    assert_eq!(v["run"]["stdout"], "bonjour\n/home/user\n1000\n", "{v}");
    assert_eq!(v["run"]["stderr"], "oops\n", "{v}");
    assert_eq!(v["run"]["exit_code"], 0, "{v}");
    assert_eq!(
        v["exit3"],
        json!({"exit_code": 3, "stdout": "partial\n"}),
        "{v}"
    );
    // Streamed as it ran: three chunks over most of a second, not one at the end.
    assert_eq!(
        v["streamed"],
        json!(["line1\n", "line2\n", "line3\n"]),
        "{v}"
    );
    assert!(v["streamed_spread_s"].as_f64().unwrap_or(0.0) > 0.3, "{v}");
    assert_eq!(v["stdin_echo"], "hello stdin\ndone\n", "{v}");
    assert_eq!(v["reconnected"], "from-background\n", "{v}");
    if sdk == NEWEST {
        assert_eq!(v["stream_input"], "streamed input\n", "{v}");
    }
    assert_eq!(v["listed"], true, "{v}");
    assert_eq!(v["killed"], true, "{v}");
    assert_eq!(v["kill_unknown"], false, "{v}");
    assert!(
        v["as_root"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("root")),
        "a command as root is refused: {v}"
    );

    // Files.
    assert_eq!(v["read"], "first line\n", "{v}");
    assert_eq!(
        v["read_rel"],
        json!([0, 1, 255, 98, 105, 110, 97, 114, 121]),
        "{v}"
    );
    assert_eq!(v["cat_rel"], "0001ff62696e617279", "{v}");
    assert_eq!(v["exists"], true, "{v}");
    assert_eq!(v["exists_missing"], false, "{v}");
    assert_eq!(v["list"], json!(["a.txt"]), "{v}");
    assert_eq!(v["mkdir"], true, "{v}");
    assert_eq!(v["mkdir_again"], false, "{v}");
    assert_eq!(v["moved"], "/home/user/dir/b.txt", "{v}");
    assert!(
        v["info_file"]["type"]
            .as_str()
            .is_some_and(|t| t.contains("FILE")),
        "{v}"
    );
    assert_eq!(v["info_file"]["size"], 11, "{v}");
    // The sandbox user is E2B's `user`, by name too.
    assert_eq!(
        (&v["info_file"]["owner"], &v["info_file"]["group"]),
        (&json!("user"), &json!("user")),
        "{v}"
    );
    // envd's `type` is what the link leads to, its `is_symlink` marks the link: the oldest
    // SDKs read the first (a file), the newest the second (a symlink).
    let link_type = if sdk == NEWEST { "SYMLINK" } else { "FILE" };
    assert!(
        v["info_link"]["type"]
            .as_str()
            .is_some_and(|t| t.contains(link_type)),
        "{sdk}: {v}"
    );
    assert_eq!(v["info_link"]["target"], "/home/user/dir/b.txt", "{v}");
    assert_eq!(v["after_remove"], false, "{v}");
    assert_eq!(v["remove_missing"], "ok", "{v}");
    assert!(
        v["read_missing"]["type"]
            .as_str()
            .is_some_and(|t| t.contains("NotFound")),
        "{v}"
    );
    assert_eq!(
        v["write_files"],
        json!(["/home/user/m/one.txt", "/home/user/m/two.txt"]),
        "{v}"
    );
    assert_eq!(v["multi_cat"], "12", "{v}");

    // The control API.
    assert_eq!(v["info"]["sandbox_id"], id, "{v}");
    assert_eq!(v["info"]["template_id"], "base", "{v}");
    assert_eq!(v["info"]["metadata"], json!({ "suite": tag }), "{v}");
    assert!(
        v["info"]["state"]
            .as_str()
            .is_some_and(|s| s.contains("RUNNING") || s.contains("running")),
        "{v}"
    );
    let lifetime = v["info"]["ends_after_start_s"].as_f64().unwrap_or(0.0);
    assert!(
        (290.0..=310.0).contains(&lifetime),
        "the create's timeout: {v}"
    );
    assert!(v["timeout_moved_s"].as_f64().unwrap_or(0.0) > 200.0, "{v}");
    assert_eq!(v["list_ids"], json!([id]), "{v}");
    assert_eq!(v["list_started_after"], json!([[id], []]), "{v}");
    assert_eq!(v["list_template"], json!([[id], []]), "{v}");
    assert_eq!(v["connect_kept_end"], true, "{v}");
    assert_eq!(v["is_running"], true, "{v}");
    let m = &v["metrics"][0];
    assert!(m["cpu_count"].as_u64().is_some_and(|c| c >= 1), "{v}");
    assert!(m["mem_total"].as_u64().is_some_and(|t| t > 0), "{v}");
    assert_eq!(v["kill"], true, "{v}");
    assert_eq!(v["killed_while_running"], "timeout", "{v}");
    assert_eq!(v["is_running_killed"], false, "{v}");
    assert_eq!(v["kill_again"], false, "{v}");
    assert!(v["connect_killed"]["type"].as_str().is_some(), "{v}");
    assert_nothing_left(&svc.cp);
    Ok(())
}

#[tokio::test]
async fn the_newest_sdk_runs_a_turn() -> Result<()> {
    a_turn(NEWEST, &[]).await
}

#[tokio::test]
async fn the_oldest_sdk_runs_a_turn() -> Result<()> {
    a_turn(OLDEST, &[]).await
}

#[tokio::test]
async fn the_newest_sdk_runs_a_turn_on_gvisor() -> Result<()> {
    a_turn(NEWEST, &[("RUNTIME", "runsc")]).await
}

async fn big_files(sdk: &str) -> Result<()> {
    let svc = service(&[]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let before = svc.cp.rss_kib().unwrap_or(0);
    let v = drive(
        sdk,
        &svc.url,
        &svc.cp.key,
        "big_files",
        json!({ "mb": 100 }),
    )
    .await?;
    assert_eq!(v["size"], 100 * 1024 * 1024, "{v}");
    assert_eq!(v["same"], true, "{v}");
    assert_eq!(v["in_sandbox"], v["sha256"], "{v}");
    // Streamed both ways: the service did not hold the file.
    let peak = svc.cp.peak_rss_kib().unwrap_or(0);
    assert!(
        peak < before + 64 * 1024,
        "peak RSS {peak} KiB from {before} KiB for a 100 MiB file"
    );
    eprintln!(
        "{sdk}: 100 MiB up {:.2} s, down {:.2} s",
        v["up_s"].as_f64().unwrap_or(0.0),
        v["down_s"].as_f64().unwrap_or(0.0)
    );
    assert_nothing_left(&svc.cp);
    Ok(())
}

#[tokio::test]
async fn the_newest_sdk_moves_100_mib_each_way() -> Result<()> {
    big_files(NEWEST).await
}

#[tokio::test]
async fn the_oldest_sdk_moves_100_mib_each_way() -> Result<()> {
    big_files(OLDEST).await
}

async fn watch(sdk: &str) -> Result<()> {
    let svc = service(&[]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let v = drive(sdk, &svc.url, &svc.cp.key, "watch", json!({ "files": 200 })).await?;
    assert_eq!(v["created_seen"], 200, "{v}");
    // Written in place, as envd writes: the file's own events (its bits set once, when new),
    // no temporary file's.
    assert_eq!(
        v["written_events"],
        json!([
            ["chmod", "note.txt"],
            ["create", "note.txt"],
            ["write", "note.txt"]
        ]),
        "{v}"
    );
    assert!(
        v["missing"]["type"]
            .as_str()
            .is_some_and(|t| t.contains("NotFound")),
        "{v}"
    );
    // 16 watchers a sandbox, the 17th refused with the reason; all gone with the sandbox.
    assert_eq!(v["watchers_kept"], 16, "{v}");
    assert!(
        v["over_cap"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("16 watchers")),
        "{v}"
    );
    assert!(
        v["after_kill"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("watcher") && m.contains("not found")),
        "{v}"
    );
    assert_nothing_left(&svc.cp);
    Ok(())
}

/// A URL signed for one path writes that path only: a second part named ~/.bashrc is not
/// written there (it would run before every later command), and a URL signed without a path
/// is refused.
async fn signed_upload(sdk: &str) -> Result<()> {
    let svc = service(&[]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let v = drive(sdk, &svc.url, &svc.cp.key, "signed_upload", json!({})).await?;
    assert_eq!(v["status"], 200, "{v}");
    // Every part to the signed path, as envd writes them: the last one stays.
    assert_eq!(v["upload"], "touch /tmp/pwned\n", "{v}");
    assert_eq!(v["a_written"], false, "{v}");
    assert_eq!(v["no_path_status"], 400, "{v}");
    assert_eq!(v["bashrc_kept"], true, "{v}");
    assert_eq!(v["pwned"], false, "{v}");
    assert_nothing_left(&svc.cp);
    Ok(())
}

#[tokio::test]
async fn a_signed_upload_url_writes_its_own_path_only() -> Result<()> {
    signed_upload(NEWEST).await
}

/// A secured sandbox's signed URLs work as their holder has them, with no header naming the
/// sandbox (its signature names it): a download, one that expires later, an upload; an expired
/// one answers envd's words, a forged one nothing, and each URL reaches its own sandbox only.
#[tokio::test]
async fn signed_urls_work_without_the_sandbox_header() -> Result<()> {
    let svc = service(&[]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let v = drive(NEWEST, &svc.url, &svc.cp.key, "signed_urls", json!({})).await?;
    for k in ["download", "download_expiring"] {
        assert_eq!(v[k]["status"], 200, "{k}: {v}");
        assert_eq!(v[k]["body"], "signed content", "{k}: {v}");
    }
    assert_eq!(v["other_download"]["body"], "the other sandbox", "{v}");
    assert_eq!(v["download_expired"]["status"], 401, "{v}");
    let expired: serde_json::Value =
        serde_json::from_str(v["download_expired"]["body"].as_str().context("body")?)?;
    assert_eq!(
        expired,
        json!({"code": 401, "message": "signature is already expired"}),
        "{v}"
    );
    assert_eq!(v["forged"]["status"], 401, "{v}");
    assert_eq!(v["upload_status"], 200, "{v}");
    assert_eq!(v["uploaded"], "uploaded by URL", "{v}");
    assert_eq!(v["other_has_upload"], false, "{v}");
    assert_nothing_left(&svc.cp);
    Ok(())
}

/// File metadata as E2B's SDK writes and reads it (envd 0.6.2): kept beside the file as
/// `user.e2b.*` attributes, read back by every entry, replaced by each upload, and set from
/// inside the sandbox too; what is not metadata is refused before anything is written.
async fn metadata(sdk: &str) -> Result<()> {
    let svc = service(&[]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let v = drive(sdk, &svc.url, &svc.cp.key, "metadata", json!({})).await?;
    let meta = json!({"author": "mish", "purpose": "upload"});
    for k in ["written", "info", "octet", "renamed"] {
        assert_eq!(v[k], meta, "{k}: {v}");
    }
    assert_eq!(v["listed"], json!({"listed.txt": {"tag": "listed"}}), "{v}");
    assert_eq!(v["overwritten"], Value::Null, "{v}");
    assert_eq!(v["overwritten_info"], Value::Null, "{v}");
    assert_eq!(
        v["set_inside"],
        json!({"author": "inside", "purpose": "upload"}),
        "{v}"
    );
    assert_eq!(v["invalid"]["type"], "InvalidArgumentException", "{v}");
    assert_eq!(v["bad_exists"], false, "{v}");
    assert!(
        v["too_many"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("at most 32 keys")),
        "{v}"
    );
    assert_nothing_left(&svc.cp);
    Ok(())
}

#[tokio::test]
async fn file_metadata_is_kept_beside_the_file() -> Result<()> {
    metadata(NEWEST).await
}

#[tokio::test]
async fn the_oldest_sdk_keeps_file_metadata() -> Result<()> {
    metadata(OLDEST).await
}

/// gVisor (the release this machine has) keeps no user attributes: an upload with metadata is
/// refused, saying so, and leaves no file; uploads without it work as ever.
#[tokio::test]
async fn file_metadata_is_refused_on_gvisor_which_keeps_none() -> Result<()> {
    let svc = service(&[("RUNTIME", "runsc")]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let v = drive(NEWEST, &svc.url, &svc.cp.key, "metadata", json!({})).await?;
    assert!(
        v["refused"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("keeps no file metadata")),
        "{v}"
    );
    assert_eq!(v["refused_left_file"], false, "{v}");
    assert_eq!(v["plain_write"], Value::Null, "{v}");
    assert_eq!(v["plain_info"], Value::Null, "{v}");
    assert_nothing_left(&svc.cp);
    Ok(())
}

/// A timeout ends the sandbox at its second, not at the reaper's next sweep (the harness runs
/// without one); `set_timeout(0)` pauses one created to pause, and `connect` resumes it whole;
/// one its client paused stays paused past its deadline (a deadline never removes a pause).
#[tokio::test]
async fn a_sandbox_ends_at_its_timeout_and_set_timeout_zero_pauses_one_made_to_pause() -> Result<()>
{
    let svc = service(&[]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let v = drive(NEWEST, &svc.url, &svc.cp.key, "deadlines", json!({})).await?;
    assert_eq!(v["short_running"], false, "{v}");
    assert_eq!(v["short_listed"], false, "removed, not kept: {v}");
    assert_eq!(v["paused_state"], "paused", "{v}");
    assert_eq!(v["paused_running"], false, "{v}");
    assert_eq!(v["resumed_state"], "running", "{v}");
    assert_eq!(v["resumed_reads"], "kept", "{v}");
    assert_eq!(v["client_paused_state"], "paused", "{v}");
    assert_eq!(v["client_paused_reads"], "paused by its client", "{v}");
    assert_nothing_left(&svc.cp);
    Ok(())
}

/// Two sandboxes made within a second list in the order they were made, both ways; pages of
/// one hold one each in that order whatever the states asked (E2B's paused is filtered before
/// the page is cut, so no page comes back short or past the end).
#[tokio::test]
async fn the_listing_orders_within_a_second_and_pages_by_state() -> Result<()> {
    let svc = service(&[]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let v = drive(NEWEST, &svc.url, &svc.cp.key, "listing", json!({})).await?;
    let (first, second) = (&v["ids"][0], &v["ids"][1]);
    assert_eq!(v["asc"], json!([first, second]), "{v}");
    assert_eq!(v["desc"], json!([second, first]), "{v}");
    let page = |id: &serde_json::Value, state: &str| json!([[id, state]]);
    assert_eq!(
        v["running_pages"],
        json!([page(second, "running"), page(first, "running")]),
        "{v}"
    );
    assert_eq!(
        v["mixed_pages"],
        json!([page(second, "paused"), page(first, "running")]),
        "{v}"
    );
    assert_eq!(
        v["paused_pages"],
        json!([page(second, "paused"), page(first, "paused")]),
        "{v}"
    );
    assert_nothing_left(&svc.cp);
    Ok(())
}

#[tokio::test]
async fn the_newest_sdk_watches_a_directory() -> Result<()> {
    watch(NEWEST).await
}

#[tokio::test]
async fn the_oldest_sdk_watches_a_directory() -> Result<()> {
    watch(OLDEST).await
}

#[tokio::test]
async fn the_sdk_drives_a_terminal() -> Result<()> {
    for sdk in [NEWEST, OLDEST] {
        let svc = service(&[]).await?;
        let _guard = DeploymentGuard(svc.cp.deployment.clone());
        let v = drive(sdk, &svc.url, &svc.cp.key, "pty", json!({})).await?;
        assert_eq!(v["sizes"], json!(["24 80", "40 120"]), "{sdk}: {v}");
        assert_eq!(v["exit_code"], 0, "{sdk}: {v}");
        assert_nothing_left(&svc.cp);
    }
    Ok(())
}

async fn lifecycle(sdk: &str) -> Result<()> {
    let svc = service(&[]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    let v = drive(sdk, &svc.url, &svc.cp.key, "lifecycle", json!({})).await?;
    assert_eq!(v["pause"], true, "{v}");
    assert_eq!(v["pause_again"], false, "already paused: {v}");
    assert_eq!(v["is_running_paused"], false, "{v}");
    assert!(
        v["state_paused"]
            .as_str()
            .is_some_and(|s| s.to_lowercase().contains("paused")),
        "{v}"
    );
    // envd's calls found it not running (the SDK's timeout error) and left it paused.
    for call in ["read_paused", "run_paused"] {
        assert!(
            v[call]["message"]
                .as_str()
                .is_some_and(|m| m.contains("paused")),
            "{call}: {v}"
        );
    }
    assert!(
        v["state_after_envd"]
            .as_str()
            .is_some_and(|s| s.to_lowercase().contains("paused")),
        "{v}"
    );
    assert_eq!(v["after_connect"], "kept", "{v}");
    assert!(
        v["state_resumed"]
            .as_str()
            .is_some_and(|s| s.to_lowercase().contains("running")),
        "{v}"
    );
    assert_eq!(v["fork_reads"], "kept", "{v}");
    assert_eq!(v["fork_is_other"], true, "{v}");
    let snap = v["snapshot_id"].as_str().context("snapshot_id")?;
    assert!(
        v["snapshots"]
            .as_array()
            .is_some_and(|s| s.iter().any(|x| x == snap)),
        "{v}"
    );
    // Listed by the name it was given, and only by it.
    let name = format!("snap-{}", &v["id"].as_str().context("id")?[..12]);
    assert_eq!(v["snapshot_names"], json!([name]), "{v}");
    assert_eq!(v["snapshots_by_name"], json!([snap]), "{v}");
    assert_eq!(v["snapshots_by_other_name"], json!([]), "{v}");
    assert_eq!(v["from_snapshot_reads"], "kept", "{v}");
    assert_eq!(v["snapshot_deleted"], true, "{v}");
    assert_eq!(v["snapshot_deleted_again"], false, "{v}");
    assert_nothing_left(&svc.cp);
    Ok(())
}

#[tokio::test]
async fn the_newest_sdk_pauses_resumes_forks_and_snapshots() -> Result<()> {
    lifecycle(NEWEST).await
}

#[tokio::test]
async fn the_oldest_sdk_pauses_resumes_forks_and_snapshots() -> Result<()> {
    lifecycle(OLDEST).await
}

#[tokio::test]
async fn bad_keys_unknown_sandboxes_and_templates_are_the_sdks_errors() -> Result<()> {
    let svc = service(&[]).await?;
    let _guard = DeploymentGuard(svc.cp.deployment.clone());
    for sdk in [NEWEST, OLDEST] {
        let v = drive(sdk, &svc.url, &svc.cp.key, "faults", json!({})).await?;
        assert_eq!(
            v["bad_key"]["type"], "AuthenticationException",
            "{sdk}: {v}"
        );
        assert!(
            v["unknown_connect"]["type"]
                .as_str()
                .is_some_and(|t| t.contains("NotFound")),
            "{sdk}: {v}"
        );
        assert_eq!(v["unknown_kill"], false, "{sdk}: {v}");
        assert!(
            v["unknown_template"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("no-such-template")),
            "{sdk}: {v}"
        );
        // 2.45's TimeoutException; newer SDKs name the case (SandboxNotRunningException).
        assert!(
            v["killed_during_run"]["type"].as_str().is_some_and(|t| [
                "TimeoutException",
                "SandboxNotRunningException"
            ]
            .contains(&t)),
            "{sdk}: {v}"
        );
        assert!(
            v["killed_during_run"]["message"]
                .as_str()
                .is_some_and(|m| m.contains("killed or reached its end of life")),
            "{sdk}: {v}"
        );
    }
    assert_nothing_left(&svc.cp);
    Ok(())
}

/// E2B's network rules through the egress gateway: the header reaches the upstream, the
/// sandbox never holds the value, a host outside `allow_out` is refused.
/// `get_host(port)` as E2B's SDK builds it reaches a server in the sandbox; a sandbox created
/// with `allow_public_traffic: False` answers only with its traffic access token.
#[tokio::test]
async fn get_host_reaches_a_server_in_the_sandbox_and_private_traffic_takes_its_token() -> Result<()>
{
    let s = service(&[("PREVIEW_DOMAIN", "preview.test")]).await?;
    for (sdk, private) in [(NEWEST, true), (OLDEST, false)] {
        let v = drive(
            sdk,
            &s.url,
            &s.cp.key,
            "ports",
            json!({ "private": private }),
        )
        .await?;
        let host = v["host"].as_str().unwrap_or("");
        assert!(
            host.starts_with("8765-") && host.ends_with(".preview.test"),
            "{sdk}: {v}"
        );
        assert_eq!(v["public"][0], 200, "{sdk}: {v}");
        assert!(
            v["public"][1]
                .as_str()
                .is_some_and(|b| b.contains("hello-from-the-sandbox")),
            "{sdk}: {v}"
        );
        assert_eq!(v["closed"], 502, "{sdk}: {v}");
        if private {
            assert_eq!(v["private_token_set"], true, "{sdk}: {v}");
            assert_eq!(v["private_without"], 403, "{sdk}: {v}");
            assert_eq!(v["private_with"][0], 200, "{sdk}: {v}");
        }
    }
    assert_nothing_left(&s.cp);
    Ok(())
}

#[tokio::test]
async fn network_rules_inject_a_header_the_sandbox_never_sees() -> Result<()> {
    let port = free_port().to_string();
    let EgressStack { up, cp } = EgressStack::start_with(&[("E2B_PORT", &port)]).await?;
    let _guard = DeploymentGuard(cp.deployment.clone());
    let url = format!("http://127.0.0.1:{port}");
    let secret = "e2b-rule-secret-0123456789abcdef";
    for sdk in [NEWEST, OLDEST] {
        let v = drive(
            sdk,
            &url,
            &cp.key,
            "network",
            json!({ "host": "api.upstream.test", "other": "denied.upstream.test", "secret": secret }),
        )
        .await?;
        assert!(
            v["upstream"].as_str().is_some_and(|s| !s.is_empty()),
            "{sdk}: {v}"
        );
        assert!(
            v["other"]["exit_code"].as_i64().is_some_and(|c| c != 0),
            "{sdk}: {v}"
        );
        assert_eq!(v["env_has_secret"], false, "{sdk}: {v}");
        assert_eq!(v["other_after_clear"], "200", "{sdk}: {v}");
        assert_eq!(
            v["secret_in_files"], "",
            "{sdk}: the secret is in the sandbox: {v}"
        );
        let seen = up.requests()?;
        assert!(
            seen.iter().any(|r| r.to_string().contains(secret)),
            "{sdk}: the upstream saw the header: {seen:?}"
        );
    }
    assert!(
        !cp.logs().contains(secret),
        "the secret is in the service's log"
    );
    Ok(())
}
