//! The in-sandbox helper end to end: commands and fs ops through its channel on real Docker,
//! the hostile review's probes (races, symlinks, FIFOs, loops, a helper killed mid-session),
//! and the channel's lifecycle. Both images; gVisor where it matters.

use anyhow::Result;
use base64::Engine as _;
use e2e::workspace::{code, fs, fs_ok};
use e2e::{BUSYBOX, ControlPlane, DEBIAN, Session, require_image};
use serde_json::{Value, json};

const R: &str = "/workspace/repo";

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

/// Runs `cmd` as root inside the container, outside the API (the test's view of the truth). The
/// container's capabilities are dropped, so this root can only act on what root owns.
fn root_sh(s: &Session, cmd: &str) -> Result<String> {
    let out = std::process::Command::new("docker")
        .args(["exec", "-u", "0", &s.id, "sh", "-c", cmd])
        .output()?;
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

async fn cp_and_session(image: &str, env: &[(&str, &str)]) -> Result<(ControlPlane, Session)> {
    require_image(image);
    let cp = ControlPlane::start_with(env).await?;
    let s = cp.session_of(image).await?;
    Ok((cp, s))
}

/// Issue 10 #2: a process swapping a directory for a symlink to /etc while writes and edits go
/// through it never gets anything written outside /workspace, and the service's own files stay
/// root's.
#[tokio::test]
async fn racing_symlink_swaps_never_write_outside_the_workspace() -> Result<()> {
    let (cp, s) = cp_and_session(DEBIAN, &[]).await?;
    let before = root_sh(&s, "sha256sum /etc/passwd; ls /etc | wc -l")?;
    let (code0, out) = cp
        .sh(
            &s,
            "mkdir -p /workspace/tmp/race/real && cd /workspace/tmp/race && printf 'root:x\\n' > real/passwd && \
             (python3 -c '
import os, time
os.chdir(\"/workspace/tmp/race\")
end = time.time() + 60
n = 0
while time.time() < end and os.path.exists(\"/workspace/tmp/race/run\"):
    try:
        real_d = os.path.isdir(\"d\") and not os.path.islink(\"d\")
        if real_d and os.path.exists(\"real\"):
            os.rename(\"d\", \"junk%d\" % n)
        elif real_d:
            os.rename(\"d\", \"real\")
        os.symlink(\"/etc\", \"d\")
        os.unlink(\"d\")
        os.rename(\"real\", \"d\")
        n += 1
    except OSError:
        pass
open(\"/workspace/tmp/race/swaps\", \"w\").write(str(n))
' >/dev/null 2>&1 &) ; touch run; echo started",
        )
        .await?;
    assert_eq!(code0, 0, "{out}");
    for i in 0..100 {
        let w = fs_ok(
            &cp,
            &s,
            "write",
            json!({"path": format!("/workspace/tmp/race/d/f{i}"), "content": b64("pwned\n")}),
        )
        .await?;
        assert!(
            w["ok"] == true || w["error"].is_object(),
            "write answered neither ok nor an fs error: {w}"
        );
        let _ = fs_ok(
            &cp,
            &s,
            "edit",
            json!({"path": "/workspace/tmp/race/d/passwd", "old": "root", "new": "pwned"}),
        )
        .await?;
    }
    cp.sh(&s, "rm -f /workspace/tmp/race/run").await?;
    // The race really ran: the swapper counted its swaps (else this test proves nothing).
    let swaps: u64 = e2e::eventually(
        "the swapper reports",
        std::time::Duration::from_secs(10),
        || async {
            let (_, out) = cp
                .sh(&s, "cat /workspace/tmp/race/swaps 2>/dev/null")
                .await?;
            Ok(out.trim().parse::<u64>().ok())
        },
    )
    .await?;
    assert!(swaps > 100, "only {swaps} swaps during the writes");
    let after = root_sh(&s, "sha256sum /etc/passwd; ls /etc | wc -l")?;
    assert_eq!(before, after, "/etc changed");
    let planted = root_sh(&s, "ls /etc | grep -c '^f[0-9]' || true")?;
    assert_eq!(planted.trim(), "0", "files landed in /etc");
    let owners = root_sh(
        &s,
        "stat -c '%u %n' /.daiv-sandbox /.daiv-sandbox/daiv-sandbox-helper",
    )?;
    for line in owners.lines() {
        assert!(line.starts_with("0 "), "not root's any more: {owners}");
    }
    // Seeding still works afterwards (the marker directory is intact).
    let tar = e2e::workspace::tar_of(&[e2e::workspace::Member::File("a.txt", b"a", 0o644)])?;
    let seeded = e2e::workspace::seed(&cp, &s, vec![("repo_archive", tar)]).await?;
    assert_eq!(seeded.status, 204);
    Ok(())
}

/// Symlinks a command planted never let an fs op read or write what the sandbox user could
/// not, nor anything outside /workspace (issue 10 #15, issue 11).
#[tokio::test]
async fn planted_symlinks_give_nothing_the_sandbox_user_lacks() -> Result<()> {
    for image in [BUSYBOX, DEBIAN] {
        let (cp, s) = cp_and_session(image, &[]).await?;
        // Root-only material outside the workspace: a file in a 0700 directory, a 0600 file.
        root_sh(
            &s,
            "mkdir -m 700 /rootdir && echo secret > /rootdir/s && chmod 644 /rootdir/s && \
             echo topsecret > /root-only && chmod 600 /root-only",
        )?;
        // Inside it, a directory its owner made untraversable: the kernel, not the service,
        // says no (the archive API, running as root, used to read through it).
        let (c, out) = cp
            .sh(
                &s,
                "mkdir -p /workspace/tmp/locked && echo secret > /workspace/tmp/locked/s && chmod 000 /workspace/tmp/locked && \
                 cd /workspace/repo && ln -s /workspace/tmp/locked/s inner && ln -s /rootdir/s rootdir && \
                 ln -s /root-only outer && ln -s /etc/passwd etc && ln -s loop loop",
            )
            .await?;
        assert_eq!(c, 0, "{out}");
        for link in ["inner", "rootdir", "outer", "etc"] {
            let r = fs_ok(&cp, &s, "read", json!({"path": format!("{R}/{link}")})).await?;
            assert_eq!(
                code(&r),
                Some("permission_denied"),
                "{image} read {link}: {r}"
            );
            assert!(!r.to_string().contains("secret"), "{r}");
            let e = fs_ok(
                &cp,
                &s,
                "edit",
                json!({"path": format!("{R}/{link}"), "old": "root", "new": "x"}),
            )
            .await?;
            assert_eq!(
                code(&e),
                Some("permission_denied"),
                "{image} edit {link}: {e}"
            );
        }
        let w = fs_ok(
            &cp,
            &s,
            "write",
            json!({"path": format!("{R}/etc/new"), "content": b64("x")}),
        )
        .await?;
        assert!(w["ok"] != true, "{w}");
        // A loop and a path through a file: fs error codes, never a 503 or a daemon message.
        for p in [format!("{R}/loop/x"), format!("{R}/inner/x")] {
            let (status, r) = fs(&cp, &s, "read", json!({"path": p})).await?;
            assert_eq!(status, 200, "{r}");
            assert!(r["error"].is_object(), "{r}");
            assert!(!r.to_string().contains("/var/lib"), "{r}");
        }
        assert_eq!(root_sh(&s, "cat /root-only")?.trim(), "topsecret");
        assert_eq!(root_sh(&s, "cat /rootdir/s")?.trim(), "secret");
    }
    Ok(())
}

/// Issue 10 #6: grep meets a FIFO and a device link without blocking, and the session answers
/// the next request.
#[tokio::test]
async fn grep_skips_fifos_and_devices() -> Result<()> {
    let (cp, s) = cp_and_session(BUSYBOX, &[]).await?;
    cp.sh(
        &s,
        "cd /workspace/repo && mkfifo fifo && ln -s /dev/zero zero && echo needle > file",
    )
    .await?;
    let r = fs_ok(&cp, &s, "grep", json!({"pattern": "needle", "path": R})).await?;
    assert_eq!(r["matches"].as_array().map(Vec::len), Some(1), "{r}");
    let r = fs_ok(
        &cp,
        &s,
        "grep",
        json!({"pattern": "needle", "path": format!("{R}/fifo")}),
    )
    .await?;
    assert_eq!(r["matches"], json!([]), "{r}");
    let r = fs_ok(&cp, &s, "read", json!({"path": format!("{R}/fifo")})).await?;
    assert!(r["error"].is_object(), "{r}");
    let ls = fs_ok(&cp, &s, "ls", json!({"path": R})).await?;
    assert_eq!(ls["error"], Value::Null);
    Ok(())
}

/// A command can kill the helper (same uid); the next request gets a fresh one.
#[tokio::test]
async fn a_helper_killed_by_a_command_is_replaced() -> Result<()> {
    for image in [BUSYBOX, DEBIAN] {
        let (cp, s) = cp_and_session(image, &[]).await?;
        let (c, _) = cp.sh(&s, "echo warm").await?;
        assert_eq!(c, 0);
        // The command's parent is the helper serving the channel.
        let _ = cp
            .run(&s, json!({"commands": ["kill -9 $PPID; sleep 1"]}))
            .await;
        let (c, out) = cp.sh(&s, "echo again").await?;
        assert_eq!((c, out.as_str()), (0, "again\n"), "{image}");
        let r = fs_ok(&cp, &s, "ls", json!({"path": R})).await?;
        assert_eq!(r["error"], Value::Null, "{image}: {r}");
    }
    Ok(())
}

/// Output is capped in the helper: a command printing 1 GiB costs the service a bounded amount
/// of memory, and the marker says how much was dropped.
#[tokio::test]
async fn a_gigabyte_of_output_is_capped_with_bounded_memory() -> Result<()> {
    let (cp, s) = cp_and_session(BUSYBOX, &[("OUTPUT_MAX_BYTES", "1048576")]).await?;
    let (c, out) = cp
        .sh(&s, "head -c 1073741824 /dev/zero | tr '\\0' a")
        .await?;
    assert_eq!(c, 0);
    assert!(out.starts_with("aaaa"));
    assert!(
        out.contains("output truncated: 1072693248 bytes omitted"),
        "{}",
        &out[out.len().saturating_sub(200)..]
    );
    let peak = cp.peak_rss_kib().unwrap_or(0);
    assert!(peak < 40 * 1024, "control plane peaked at {peak} KiB");
    Ok(())
}

/// A backgrounded child holding stdout open does not hold the request; a timeout still kills
/// the whole process group.
#[tokio::test]
async fn background_children_neither_hang_requests_nor_survive_timeouts() -> Result<()> {
    for image in [BUSYBOX, DEBIAN] {
        let (cp, s) = cp_and_session(image, &[]).await?;
        let (c, out) = cp.sh(&s, "sleep 600 & echo detached").await?;
        assert_eq!((c, out.as_str()), (0, "detached\n"), "{image}");
        let results = cp
            .run(
                &s,
                json!({"commands": ["echo before; sleep 700 & sleep 800", "echo skipped"], "timeout": 2}),
            )
            .await?;
        assert_eq!(results.len(), 1, "{results:?}");
        assert_eq!(results[0]["exit_code"], 124);
        assert_eq!(results[0]["output"], "before\n");
        let ps = root_sh(&s, "ps -o args 2>/dev/null || ps")?;
        assert!(
            !ps.contains("sleep 700"),
            "{image}: timed-out group survived:\n{ps}"
        );
        assert!(
            !ps.contains("sleep 800"),
            "{image}: timed-out group survived:\n{ps}"
        );
    }
    Ok(())
}

/// Results come from the helper's framing only: a command printing anything (old batch
/// markers, frame-like bytes) cannot add or alter results (issue 10 #13).
#[tokio::test]
async fn commands_cannot_forge_results() -> Result<()> {
    let (cp, s) = cp_and_session(BUSYBOX, &[]).await?;
    let forge = r"cat /proc/$PPID/cmdline | tr '\0' ' '; printf '\036deadbeef:E:0\n\036deadbeef:B\n\000\000\000\012\000\000\000\001\006{}'; exit 3";
    let results = cp
        .run(&s, json!({"commands": [forge, "echo second"]}))
        .await?;
    assert_eq!(results.len(), 2, "{results:?}");
    assert_eq!(results[0]["exit_code"], 3);
    assert_eq!(results[1]["output"], "second\n");
    // Nor can a command reach into the helper (same uid): it is not dumpable, so its /proc
    // entries are root's and it cannot be ptraced or have its memory written.
    let (c, out) = cp
        .sh(
            &s,
            "stat -c %u /proc/$PPID/mem; cat /proc/$PPID/mem >/dev/null 2>&1 || echo denied",
        )
        .await?;
    assert_eq!((c, out.as_str()), (0, "0\ndenied\n"));
    Ok(())
}

/// Names that are not UTF-8 and a directory of 10,000 entries, through ls, glob and grep.
#[tokio::test]
async fn odd_names_and_big_directories() -> Result<()> {
    let (cp, s) = cp_and_session(BUSYBOX, &[]).await?;
    let (c, out) = cp
        .sh(
            &s,
            "mkdir -p /workspace/tmp/many /workspace/tmp/odd && cd /workspace/tmp/many && seq 1 10000 | xargs touch && \
             echo hit > \"/workspace/tmp/odd/bad$(printf '\\377')name\"",
        )
        .await?;
    assert_eq!(c, 0, "{out}");
    let r = fs_ok(&cp, &s, "ls", json!({"path": "/workspace/tmp/many"})).await?;
    assert_eq!(r["entries"].as_array().map(Vec::len), Some(10_000));
    let r = fs_ok(&cp, &s, "ls", json!({"path": "/workspace/tmp/odd"})).await?;
    let entries = r["entries"].as_array().cloned().unwrap_or_default();
    assert_eq!(entries.len(), 1, "{r}");
    assert!(
        entries[0]["path"]
            .as_str()
            .is_some_and(|p| p.starts_with("/workspace/tmp/odd/bad")),
        "{r}"
    );
    let r = fs_ok(
        &cp,
        &s,
        "grep",
        json!({"pattern": "hit", "path": "/workspace/tmp/odd"}),
    )
    .await?;
    assert_eq!(r["matches"].as_array().map(Vec::len), Some(1), "{r}");
    Ok(())
}

/// fs/write whose parent is a regular file is `exec_failed` (the README reserves
/// `not_a_directory` for ls/glob on a file), and the workspace is a volume that survives a
/// stop and start.
#[tokio::test]
async fn write_under_a_file_and_the_workspace_volume() -> Result<()> {
    let (cp, s) = cp_and_session(BUSYBOX, &[]).await?;
    fs_ok(
        &cp,
        &s,
        "write",
        json!({"path": format!("{R}/file"), "content": b64("x")}),
    )
    .await?;
    let r = fs_ok(
        &cp,
        &s,
        "write",
        json!({"path": format!("{R}/file/child"), "content": b64("x")}),
    )
    .await?;
    assert_eq!(code(&r), Some("exec_failed"), "{r}");
    let info = e2e::inspect(&s.id).expect("sandbox");
    let mounts = info["Mounts"].as_array().cloned().unwrap_or_default();
    assert!(
        mounts
            .iter()
            .any(|m| m["Destination"] == "/workspace" && m["Type"] == "volume"),
        "{mounts:?}"
    );
    let (status, _) = cp
        .call(
            reqwest::Method::DELETE,
            &format!("/session/{}/", s.id),
            None,
        )
        .await?;
    assert_eq!(status, 204);
    let r = fs_ok(&cp, &s, "read", json!({"path": format!("{R}/file")})).await?;
    assert_eq!(r["content"], "x", "{r}");
    let owner = root_sh(&s, "stat -c %u:%g /workspace /workspace/repo")?;
    assert_eq!(owner.trim(), "1000:1000\n1000:1000".replace("\\n", "\n"));
    Ok(())
}

/// Deployments do not see each other's sessions, even with the same key (issue 10 #7).
#[tokio::test]
async fn deployments_are_isolated() -> Result<()> {
    require_image(BUSYBOX);
    let a = ControlPlane::start_with(&[("DEPLOYMENT", "e2e-a")]).await?;
    let b = ControlPlane::start_with(&[("DEPLOYMENT", "e2e-b"), ("API_KEY", &a.key)]).await?;
    let s = a.session_of(BUSYBOX).await?;
    let as_b = |method: reqwest::Method, path: String, body: Option<Value>| {
        let mut req = b
            .http()
            .request(method, b.url(&path))
            .header("X-API-Key", &a.key);
        if let Some(body) = body {
            req = req.json(&body);
        }
        req.send()
    };
    let r = as_b(
        reqwest::Method::POST,
        format!("/session/{}/", s.id),
        Some(json!({"commands": ["id"]})),
    )
    .await?;
    assert_eq!(r.status().as_u16(), 404);
    let r = as_b(
        reqwest::Method::POST,
        format!("/session/{}/fs/ls", s.id),
        Some(json!({"path": R})),
    )
    .await?;
    assert_eq!(r.status().as_u16(), 404);
    let r = as_b(
        reqwest::Method::DELETE,
        format!("/session/{}/?force=true", s.id),
        None,
    )
    .await?;
    assert_eq!(r.status().as_u16(), 404);
    let (c, _) = a.sh(&s, "true").await?;
    assert_eq!(c, 0, "the owner still drives its session");
    Ok(())
}

/// A client that disconnects cancels its command: the helper kills the whole process group.
#[tokio::test]
async fn a_disconnected_client_cancels_its_command() -> Result<()> {
    let (cp, s) = cp_and_session(BUSYBOX, &[]).await?;
    let impatient = reqwest::Client::builder()
        .timeout(std::time::Duration::from_millis(1500))
        .build()?;
    let gone = impatient
        .post(cp.url(&format!("/session/{}/", s.id)))
        .header("X-API-Key", &cp.key)
        .json(&json!({"commands": ["touch /workspace/tmp/started; sleep 900 & sleep 901"]}))
        .send()
        .await;
    assert!(
        gone.is_err(),
        "the request should have timed out client-side"
    );
    // It did start (else the processes' absence below proves nothing).
    assert_eq!(
        root_sh(&s, "test -e /workspace/tmp/started && echo yes")?.trim(),
        "yes"
    );
    e2e::eventually(
        "the cancelled command's process group is gone",
        std::time::Duration::from_secs(20),
        || async {
            let ps = root_sh(&s, "ps -o args 2>/dev/null || ps")?;
            Ok((!ps.contains("sleep 900") && !ps.contains("sleep 901")).then_some(()))
        },
    )
    .await?;
    let (c, out) = cp.sh(&s, "echo next").await?;
    assert_eq!((c, out.as_str()), (0, "next\n"));
    Ok(())
}
