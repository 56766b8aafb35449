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
/// container keeps only the helper's capabilities (SETUID, SETGID, KILL), so this root can only
/// act on what root owns, and signal anything.
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

/// What a command can do to process `$1`: each word names one thing that worked.
const PROBE: &str = r#"
probe() {
  kill -0 "$1" 2>/dev/null && echo signal
  kill -STOP "$1" 2>/dev/null && { echo stop; kill -CONT "$1"; }
  ls "/proc/$1/fd" >/dev/null 2>&1 && echo fds
  (: >> "/proc/$1/fd/1") 2>/dev/null && echo open-fd
  cat "/proc/$1/environ" >/dev/null 2>&1 && echo environ
  if command -v python3 >/dev/null; then
    python3 -c 'import ctypes,sys; l=ctypes.CDLL(None); sys.exit(l.ptrace(16,int(sys.argv[1]),0,0)!=0)' "$1" && echo ptrace
  fi
}
helpers=""
for p in /proc/[0-9]*; do
  case "$(tr '\0' ' ' < "$p/cmdline" 2>/dev/null)" in
    *daiv-sandbox-helper\ serve*|*daiv-sandbox-helper\ init*) helpers="$helpers ${p#/proc/}";;
  esac
done
echo "helpers:$helpers"
for pid in $helpers; do echo "pid $pid: $(probe "$pid" | tr '\n' ' ')"; done
sleep 30 > /workspace/tmp/probe.out & mine=$!
# The child redirects its stdout before it execs: wait for that, or the probe races it.
i=0; until [ "$(readlink "/proc/$mine/fd/1")" = /workspace/tmp/probe.out ] || [ $i -ge 100 ]; do
  sleep 0.05; i=$((i+1)); done
echo "own child: $(probe "$mine" | tr '\n' ' ')"
kill "$mine"
if command -v python3 >/dev/null; then
  python3 -c '
import ctypes, os, sys, time
l = ctypes.CDLL(None)
child = os.fork()
if child == 0:
    time.sleep(30)
    os._exit(0)
print("own ptrace:", "ptrace" if l.ptrace(16, child, 0, 0) == 0 else "denied")
os.kill(child, 9)
'
fi
"#;

/// Issue 25 #3: the helper (`serve`, and `init`, the process supervisor) runs under a uid of its
/// own: a command can neither signal, stop, trace nor open the pipes of either, so nothing it
/// does can answer the control plane in the helper's place. The same probes succeed on the
/// command's own child, so they do detect access.
async fn the_helper_is_out_of_reach_of_commands(runtime: &str) -> Result<()> {
    for image in [BUSYBOX, DEBIAN] {
        let (cp, s) = cp_and_session(image, &[("RUNTIME", runtime)]).await?;
        let (_, before) = cp.sh(&s, "echo warm").await?;
        assert_eq!(before, "warm\n");
        let (code, out) = cp.sh(&s, PROBE).await?;
        assert_eq!(code, 0, "{image} {runtime}: {out}");
        let helpers: Vec<&str> = out
            .lines()
            .find_map(|l| l.strip_prefix("helpers:"))
            .unwrap_or_default()
            .split_whitespace()
            .collect();
        assert!(
            helpers.len() >= 2,
            "{image} {runtime}: serve and init not found: {out}"
        );
        // gVisor's procfs lists the fd names and shows the environment of other users'
        // processes (the container's environment: nothing secret); it opens none of the fds.
        let shown: &[&str] = if runtime == "runsc" {
            &["fds", "environ"]
        } else {
            &[]
        };
        for line in out.lines().filter(|l| l.starts_with("pid ")) {
            let (_, got) = line.split_once(':').unwrap_or_default();
            let reached: Vec<&str> = got
                .split_whitespace()
                .filter(|a| !shown.contains(a))
                .collect();
            assert!(
                reached.is_empty(),
                "{image} {runtime}: a command reached the helper ({reached:?}): {out}"
            );
        }
        let own = out
            .lines()
            .find_map(|l| l.strip_prefix("own child:"))
            .unwrap_or_default();
        for access in ["signal", "stop", "open-fd"] {
            assert!(
                own.contains(access),
                "{image} {runtime}: probe {access} is blind: {out}"
            );
        }
        if image == DEBIAN {
            assert!(
                out.contains("own ptrace: ptrace"),
                "{runtime}: the ptrace probe is blind: {out}"
            );
        }
        // The helper processes are the same ones, and they still answer.
        let (_, after) = cp.sh(&s, PROBE).await?;
        let helpers_after = after.lines().find_map(|l| l.strip_prefix("helpers:"));
        assert_eq!(
            helpers_after.map(|h| h.split_whitespace().collect::<Vec<_>>()),
            Some(helpers.clone()),
            "{image} {runtime}"
        );
        let (c, out) = cp.sh(&s, "kill -9 $PPID; echo still").await?;
        assert!(
            c == 0 && out.contains("not permitted") && out.ends_with("still\n"),
            "{image} {runtime}: {out}"
        );
        let r = fs_ok(&cp, &s, "ls", json!({"path": R})).await?;
        assert_eq!(r["error"], Value::Null, "{image} {runtime}: {r}");
    }
    Ok(())
}

#[tokio::test]
async fn the_helper_is_out_of_reach_of_commands_on_runc() -> Result<()> {
    the_helper_is_out_of_reach_of_commands("runc").await
}

#[tokio::test]
async fn the_helper_is_out_of_reach_of_commands_on_gvisor() -> Result<()> {
    the_helper_is_out_of_reach_of_commands("runsc").await
}

/// A helper that dies anyway (here killed by root from outside) is replaced on the next request.
#[tokio::test]
async fn a_helper_that_died_is_replaced() -> Result<()> {
    let (cp, s) = cp_and_session(BUSYBOX, &[]).await?;
    let (c, _) = cp.sh(&s, "echo warm").await?;
    assert_eq!(c, 0);
    root_sh(
        &s,
        "for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline | grep -q 'helper serve' && kill -9 ${p#/proc/}; done",
    )?;
    let (c, out) = cp.sh(&s, "echo again").await?;
    assert_eq!((c, out.as_str()), (0, "again\n"));
    let r = fs_ok(&cp, &s, "ls", json!({"path": R})).await?;
    assert_eq!(r["error"], Value::Null, "{r}");
    Ok(())
}

/// Output is capped in the helper: a command printing 1 GiB costs the service a bounded amount
/// of memory, and the marker says how much was dropped.
#[tokio::test]
async fn a_gigabyte_of_output_is_capped_with_bounded_memory() -> Result<()> {
    let (cp, s) = cp_and_session(BUSYBOX, &[("OUTPUT_MAX_BYTES", "1048576")]).await?;
    let before = cp.rss_kib().unwrap_or(0);
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
    let peak = cp.peak_rss_kib().unwrap_or(u64::MAX);
    // What a gigabyte of output adds on top of the service's own footprint.
    assert!(
        peak.saturating_sub(before) < 24 * 1024,
        "control plane peaked at {peak} KiB (from {before} KiB)"
    );
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
    // Issue 41 #7: every entry, as the reference answers.
    let r = fs_ok(&cp, &s, "ls", json!({"path": "/workspace/tmp/many"})).await?;
    assert_eq!(r["entries"].as_array().map(Vec::len), Some(10_000));
    let r = fs_ok(
        &cp,
        &s,
        "glob",
        json!({"pattern": "*", "path": "/workspace/tmp/many"}),
    )
    .await?;
    assert_eq!(r["matches"].as_array().map(Vec::len), Some(10_000));
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

/// fs/write whose parent is a regular file is `exec_failed` (docs/api/workspace.md reserves
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
        let mut req = b.api().with_key(&a.key).request(method, &path);
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
    // Impatient: this request alone gives up after 1.5 s.
    let gone = cp
        .request(reqwest::Method::POST, &format!("/session/{}/", s.id))
        .timeout(std::time::Duration::from_millis(1500))
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

/// `target/helper/`, where `make build` puts the static helpers.
fn helper_dir() -> std::path::PathBuf {
    let exe = std::env::current_exe().unwrap_or_default();
    // target/<profile>/deps/<test> -> target/helper
    exe.ancestors()
        .nth(3)
        .map(|t| t.join("helper"))
        .unwrap_or_default()
}

/// An image with the real helper at `/opt/daiv-sandbox-helper`, where the hostile one finds it.
struct HostileImage(String);

impl HostileImage {
    fn build() -> Result<Self> {
        let real = helper_dir().join("daiv-sandbox-helper");
        anyhow::ensure!(
            real.is_file(),
            "{} missing: run `make build`",
            real.display()
        );
        let dir = std::env::temp_dir().join(format!("daiv-e2e-hostile-{}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        std::fs::copy(&real, dir.join("daiv-sandbox-helper"))?;
        std::fs::write(
            dir.join("Dockerfile"),
            format!("FROM {DEBIAN}\nCOPY daiv-sandbox-helper /opt/daiv-sandbox-helper\n"),
        )?;
        let tag = format!("daiv-e2e-hostile:{}", std::process::id());
        let built = std::process::Command::new("docker")
            .args(["build", "-q", "-t", &tag])
            .arg(&dir)
            .output()?;
        let _ = std::fs::remove_dir_all(&dir);
        anyhow::ensure!(
            built.status.success(),
            "docker build: {}",
            String::from_utf8_lossy(&built.stderr)
        );
        Ok(Self(tag))
    }
}

impl Drop for HostileImage {
    fn drop(&mut self) {
        e2e::docker_quietly(&["rmi", "-f", &self.0]);
    }
}

/// The hostile image and a service that gives its sandboxes the hostile helper.
async fn hostile_service() -> Result<(HostileImage, ControlPlane)> {
    require_image(DEBIAN);
    let image = HostileImage::build()?;
    let hostile = helper_dir().join("daiv-e2e-hostile-helper");
    anyhow::ensure!(
        hostile.is_file(),
        "{} missing: run `make build`",
        hostile.display()
    );
    let hostile = hostile.display().to_string();
    let cp = ControlPlane::start_with(&[("HELPER_BIN", hostile.as_str())]).await?;
    Ok((image, cp))
}

/// Issue 25 #1: a helper that floods its channel (as a sandbox that took over its pipes did:
/// frames for ids nobody waits on, tiny and 16 MiB ones, without end) loses its channel at its
/// first bad frame, its session answers 503 at once and opens no new channel for a while, the
/// control plane's memory stays bounded, and another session of the same service keeps
/// answering throughout.
#[tokio::test]
async fn a_helper_that_floods_its_channel_is_cut_off_and_costs_nothing_else() -> Result<()> {
    let (image, cp) = hostile_service().await?;
    let quiet = cp.session(json!({"base_image": image.0})).await?;
    let loud = cp
        .session(json!({"base_image": image.0, "environment": {"DAIV_E2E_FLOOD": "1"}}))
        .await?;
    let run = format!("/session/{}/", loud.id);
    // Past the 30 s during which a misbehaving helper gets no new channel: it floods twice.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(40);
    let mut rounds = 0;
    while std::time::Instant::now() < until {
        let (status, body) = cp
            .call(
                reqwest::Method::POST,
                &run,
                Some(json!({"commands": ["true"]})),
            )
            .await?;
        assert_eq!(status, 503, "{body}");
        let (code, out) = cp.sh(&quiet, "echo fine").await?;
        assert_eq!((code, out.as_str()), (0, "fine\n"));
        rounds += 1;
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    let logs = cp.logs();
    let violations = logs.matches("broke the protocol; channel closed").count();
    assert!(
        violations >= 2,
        "{violations} channels cut off in {rounds} rounds"
    );
    let peak_mib = cp.peak_rss_kib().unwrap_or(u64::MAX) / 1024;
    assert!(
        peak_mib < 150,
        "the control plane's memory peaked at {peak_mib} MiB under the flood"
    );
    eprintln!("flood: {rounds} rounds, {violations} channels cut off, peak RSS {peak_mib} MiB");
    Ok(())
}

/// Issue 22 #2: a session whose helper speaks another protocol version (one made by another
/// build) is not spoken to; this build's helper is put beside it and serves the session, so
/// commands and fs ops keep working, and the log says why.
#[tokio::test]
async fn a_helper_of_another_protocol_is_replaced_by_this_builds() -> Result<()> {
    let (image, cp) = hostile_service().await?;
    let old = cp
        .session(json!({"base_image": image.0, "environment": {"DAIV_E2E_OTHER_PROTOCOL": "1"}}))
        .await?;
    let (code, out) = cp.sh(&old, "echo fine").await?;
    assert_eq!((code, out.as_str()), (0, "fine\n"));
    let (status, body) = cp
        .call(
            reqwest::Method::POST,
            &format!("/session/{}/fs/ls", old.id),
            Some(json!({"path": "/workspace"})),
        )
        .await?;
    assert_eq!(status, 200, "{body}");
    let logs = cp.logs();
    assert!(
        logs.contains("session helper speaks another protocol; serving from this build's helper"),
        "{logs}"
    );
    // The session's own helper is left where it was; this build's sits beside it, root's.
    let (code, listing) = cp
        .sh(
            &old,
            "stat -c '%U %a %n' /.daiv-sandbox/daiv-sandbox-helper*",
        )
        .await?;
    assert_eq!(code, 0, "{listing}");
    assert!(
        listing.contains("root 755 /.daiv-sandbox/daiv-sandbox-helper-p"),
        "{listing}"
    );
    Ok(())
}

/// Issue 25 #5: directories of 110,000 files (which a sandbox prepares in seconds) listed twelve
/// times at once over several sessions: every entry is answered (the reference's answer), and
/// the service's memory stays far below what the whole answers held at once took (16.7 MB each,
/// a 529 MiB peak), since each listing streams through it.
#[tokio::test]
async fn listings_of_huge_directories_cost_bounded_memory() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        let s = cp.session_of(BUSYBOX).await?;
        let (c, out) = cp
            .sh(
                &s,
                "mkdir -p /workspace/tmp/huge && cd /workspace/tmp/huge && seq 1 110000 | xargs touch",
            )
            .await?;
        assert_eq!(c, 0, "{out}");
        sessions.push(s);
    }
    let listings = (0..12).map(|i| {
        let (cp, s) = (&cp, &sessions[i % sessions.len()]);
        async move {
            let op = if i % 2 == 0 { "ls" } else { "glob" };
            let body = if op == "ls" {
                json!({"path": "/workspace/tmp/huge"})
            } else {
                json!({"pattern": "*", "path": "/workspace/tmp/huge"})
            };
            fs_ok(cp, s, op, body).await
        }
    });
    // Every entry comes, streamed through the service, which never holds a listing whole.
    for r in futures::future::join_all(listings).await {
        let r = r?;
        let found = r["entries"]
            .as_array()
            .or_else(|| r["matches"].as_array())
            .map_or(0, Vec::len);
        assert_eq!(found, 110_000, "{}", r.to_string().len());
    }
    let peak_mib = cp.peak_rss_kib().unwrap_or(u64::MAX) / 1024;
    eprintln!("12 listings of 110,000 entries: peak RSS {peak_mib} MiB");
    assert!(peak_mib < 120, "peak RSS {peak_mib} MiB");
    Ok(())
}

/// The helper volume sandbox `id` mounts at `/.daiv-sandbox/bin`: its name and whether it is
/// writable.
fn helper_mount(id: &str) -> Option<(String, bool)> {
    let c = e2e::inspect(id)?;
    let m = c["Mounts"]
        .as_array()?
        .iter()
        .find(|m| m["Destination"] == "/.daiv-sandbox/bin")?;
    Some((m["Name"].as_str()?.to_string(), m["RW"].as_bool()?))
}

/// Every sandbox runs the engine's one read-only copy of the helper: two sessions mount the same
/// volume, neither carries a copy in its own layer (3.6 MB each before), neither can change it;
/// a volume removed by hand is written again by the next create; a clean stop removes it once no
/// sandbox mounts it.
#[tokio::test]
async fn sandboxes_share_one_read_only_helper_that_a_clean_stop_removes() -> Result<()> {
    use anyhow::{Context, ensure};
    require_image(DEBIAN);
    let cp = ControlPlane::start().await?;
    let ours = format!("daiv.sandbox.deployment={}", cp.deployment);
    let shared = || {
        let mut v = e2e::volumes_with(&[&ours, "daiv.sandbox.role=helper"]);
        v.extend(e2e::volumes_with(&[
            &ours,
            "daiv.sandbox.role=helper-ready",
        ]));
        v
    };
    let a = cp.session_of(DEBIAN).await?;
    let b = cp.session_of(DEBIAN).await?;
    let (volume, writable) = helper_mount(&a.id).context("a's helper mount")?;
    ensure!(!writable, "the helper is mounted writable");
    ensure!(helper_mount(&b.id) == Some((volume.clone(), false)));
    for s in [&a, &b] {
        let size = e2e::docker(&["inspect", "--size", "-f", "{{.SizeRw}}", &s.id])?;
        let size: u64 = size.trim().parse()?;
        ensure!(
            size < 1_000_000,
            "{} bytes in the sandbox's own layer",
            size
        );
    }
    let (code, out) = cp
        .sh(
            &a,
            "readlink /.daiv-sandbox/daiv-sandbox-helper; stat -c '%U %a' /.daiv-sandbox/bin/*; \
             cp /bin/true /.daiv-sandbox/bin/x 2>/dev/null; echo copy=$?; \
             ln -sf /bin/true /.daiv-sandbox/daiv-sandbox-helper 2>/dev/null; echo link=$?",
        )
        .await?;
    ensure!(code == 0, "{out}");
    ensure!(
        out.starts_with("/.daiv-sandbox/bin/daiv-sandbox-helper-") && out.contains("root 755"),
        "{out}"
    );
    ensure!(
        out.contains("copy=1") && out.contains("link=1"),
        "the sandbox changed the helper: {out}"
    );

    // Removed by hand once no sandbox mounts it: the next create writes it again.
    cp.force_close(&a).await?;
    cp.force_close(&b).await?;
    for v in shared() {
        e2e::docker(&["volume", "rm", &v])?;
    }
    let c = cp.session_of(DEBIAN).await?;
    let (code, out) = cp.sh(&c, "echo runs").await?;
    ensure!((code, out.as_str()) == (0, "runs\n"), "{code} {out}");
    ensure!(shared().len() == 2, "{:?}", shared());

    // A clean stop removes it once its last sandbox went.
    cp.force_close(&c).await?;
    let pid = cp.pid().to_string();
    let stopped = std::process::Command::new("kill")
        .args(["-TERM", &pid])
        .status()?;
    ensure!(stopped.success(), "kill -TERM {pid}");
    e2e::eventually(
        "the shared helper removed at the clean stop",
        std::time::Duration::from_secs(30),
        || async { Ok(shared().is_empty().then_some(())) },
    )
    .await
    .with_context(|| format!("left: {:?}", shared()))?;
    Ok(())
}

/// An image that ships the shared helper's mount point as a link into a directory the sandbox
/// user can write (so the sandbox could later swap the binary the service runs as root) gets no
/// working sandbox: the helper refuses to start from such a mount. Without that check the
/// session below runs commands.
#[tokio::test]
async fn an_image_that_links_the_helpers_mount_point_elsewhere_gets_no_sandbox() -> Result<()> {
    require_image(DEBIAN);
    let dir = std::env::temp_dir().join(format!("daiv-e2e-linked-bin-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::write(
        dir.join("Dockerfile"),
        format!(
            "FROM {DEBIAN}\nRUN mkdir -p /.daiv-sandbox /opt/evil/real && chmod 777 /opt/evil \
             && ln -s /opt/evil/l /.daiv-sandbox/bin && ln -s /opt/evil/real /opt/evil/l\n"
        ),
    )?;
    let tag = format!("daiv-e2e-linked-bin:{}", std::process::id());
    let built = std::process::Command::new("docker")
        .args(["build", "-q", "-t", &tag])
        .arg(&dir)
        .output()?;
    let _ = std::fs::remove_dir_all(&dir);
    anyhow::ensure!(
        built.status.success(),
        "docker build: {}",
        String::from_utf8_lossy(&built.stderr)
    );
    struct Image(String);
    impl Drop for Image {
        fn drop(&mut self) {
            e2e::docker_quietly(&["rmi", "-f", &self.0]);
        }
    }
    let image = Image(tag);
    let cp = ControlPlane::start().await?;
    let (status, body) = cp
        .call(
            reqwest::Method::POST,
            "/session/",
            Some(json!({"base_image": image.0})),
        )
        .await?;
    if status != 200 {
        return Ok(()); // refused at the create: no sandbox
    }
    let session = Session {
        id: body["session_id"].as_str().unwrap_or_default().to_string(),
    };
    let ran = cp.sh(&session, "id -u").await;
    anyhow::ensure!(
        !matches!(&ran, Ok((0, _))),
        "a sandbox whose helper mount point is a link ran a command: {ran:?}"
    );
    let logs = root_logs(&session.id);
    anyhow::ensure!(
        logs.contains("refusing to start"),
        "the helper did not say why: {logs}"
    );
    Ok(())
}

/// What sandbox `id`'s container printed (its helper's complaints at start).
fn root_logs(id: &str) -> String {
    std::process::Command::new("docker")
        .args(["logs", id])
        .output()
        .map(|o| {
            format!(
                "{}{}",
                String::from_utf8_lossy(&o.stdout),
                String::from_utf8_lossy(&o.stderr)
            )
        })
        .unwrap_or_default()
}
