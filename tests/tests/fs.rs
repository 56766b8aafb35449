//! The fs/* operations end to end on both images, every error code included. Every 200 body is
//! validated against DAIV's wire schemas by the helper.

use anyhow::Result;
use base64::Engine as _;
use e2e::workspace::{Member, code, fs, fs_ok, gzip, seed, tar_of};
use e2e::{BUSYBOX, ControlPlane, DEBIAN, DeploymentGuard, Session, require_image};
use reqwest::Method;
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

const R: &str = "/workspace/repo";

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

async fn seeded(cp: &ControlPlane, image: &str) -> Result<Session> {
    let lines: String = (1..=10).map(|i| format!("line {i}\n")).collect();
    let archive = tar_of(&[
        Member::File(
            "src/app.py",
            b"import os\ndef main():\n    return 42\n",
            0o644,
        ),
        Member::File("src/util.py", b"def helper():\n    return 'x'\n", 0o644),
        Member::File("src/deep/nested/mod.py", b"VALUE = 1\n", 0o644),
        Member::File(".hidden.py", b"secret = 1\n", 0o644),
        Member::File("README.md", b"# Title\nhello world\n", 0o644),
        Member::File("ten.txt", lines.as_bytes(), 0o644),
        Member::File("crlf.txt", b"one\r\ntwo\r\n", 0o644),
        Member::File("noeol.txt", b"end", 0o644),
        Member::File("empty.txt", b"", 0o644),
        Member::File("bin.dat", b"\x00\xff\xfe binary", 0o644),
        Member::File(".git/config", b"[core]\nhello world\n", 0o644),
        Member::File("target/debug/out.txt", b"hello world\n", 0o644),
        Member::File("node_modules/dep/index.js", b"hello world\n", 0o644),
        Member::File("we:ird:1:name.txt", b"hello world\n", 0o644),
        Member::Symlink("link.md", "README.md"),
    ])?;
    let s = cp.session_of(image).await?;
    let r = seed(cp, &s, vec![("repo_archive", gzip(&archive)?)]).await?;
    anyhow::ensure!(r.status == 204, "seed: {r:?}");
    Ok(s)
}

fn paths(v: &Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|e| e["path"].as_str().unwrap_or_default().to_string())
                .collect()
        })
        .unwrap_or_default()
}

async fn invalid_paths(cp: &ControlPlane, s: &Session) -> Result<()> {
    for op in ["ls", "read", "grep", "glob", "write", "edit", "delete"] {
        for bad in [
            "relative/x",
            "/workspace/../etc/passwd",
            "/etc/passwd",
            "/workspace/a\nb",
        ] {
            let body = json!({"path": bad, "pattern": "x", "content": "", "old": "a", "new": "b"});
            let r = fs_ok(cp, s, op, body).await?;
            assert_eq!(code(&r), Some("invalid_path"), "{op} {bad:?}: {r}");
        }
    }
    // The file ops refuse the root itself; the directory ops accept it.
    for op in ["read", "write", "edit", "delete"] {
        let body = json!({"path": "/workspace", "content": "", "old": "a", "new": "b"});
        assert_eq!(
            code(&fs_ok(cp, s, op, body).await?),
            Some("invalid_path"),
            "{op}"
        );
    }
    let r = fs_ok(cp, s, "ls", json!({"path": "/workspace"})).await?;
    assert_eq!(code(&r), None, "{r}");
    let ghost = Session { id: "0".repeat(64) };
    let (status, _) = fs(cp, &ghost, "ls", json!({"path": R})).await?;
    assert_eq!(status, 404);
    std::mem::forget(ghost);
    Ok(())
}

async fn ls_and_glob(cp: &ControlPlane, s: &Session) -> Result<()> {
    let r = fs_ok(cp, s, "ls", json!({"path": "/workspace"})).await?;
    let names = paths(&r, "entries");
    for d in ["/workspace/repo", "/workspace/skills", "/workspace/tmp"] {
        assert!(names.contains(&d.to_string()), "{r}");
    }
    let r = fs_ok(cp, s, "ls", json!({"path": format!("{R}/src")})).await?;
    assert_eq!(
        r["entries"],
        json!([{"path": format!("{R}/src/deep"), "is_dir": true},
               {"path": format!("{R}/src/app.py"), "is_dir": false},
               {"path": format!("{R}/src/util.py"), "is_dir": false}])
    );
    let r = fs_ok(cp, s, "ls", json!({"path": format!("{R}/missing")})).await?;
    assert_eq!(code(&r), Some("not_found"));
    let r = fs_ok(cp, s, "ls", json!({"path": format!("{R}/README.md")})).await?;
    assert_eq!(code(&r), Some("not_a_directory"));
    // Hostile names: a newline inside a name survives listing.
    cp.sh(
        s,
        "mkdir -p /workspace/tmp/odd && touch '/workspace/tmp/odd/a\nb'",
    )
    .await?;
    let r = fs_ok(cp, s, "ls", json!({"path": "/workspace/tmp/odd"})).await?;
    assert_eq!(paths(&r, "entries"), ["/workspace/tmp/odd/a\nb"]);

    let r = fs_ok(cp, s, "glob", json!({"path": R, "pattern": "**/*.py"})).await?;
    assert_eq!(
        paths(&r, "matches"),
        [
            format!("{R}/.hidden.py"),
            format!("{R}/src/app.py"),
            format!("{R}/src/deep/nested/mod.py"),
            format!("{R}/src/util.py"),
        ]
    );
    let r = fs_ok(cp, s, "glob", json!({"path": R, "pattern": "src/*.py"})).await?;
    assert_eq!(paths(&r, "matches").len(), 2, "{r}");
    let r = fs_ok(cp, s, "glob", json!({"path": R, "pattern": "src/*"})).await?;
    assert!(
        r["matches"]
            .as_array()
            .is_some_and(|m| m.iter().any(|e| e["is_dir"] == true)),
        "{r}"
    );
    // Pruned by default (.git, target) and per request (node_modules).
    let r = fs_ok(cp, s, "glob", json!({"path": R, "pattern": "**/*"})).await?;
    let all = paths(&r, "matches");
    assert!(
        !all.iter()
            .any(|p| p.contains("/.git") || p.contains("/target")),
        "{all:?}"
    );
    assert!(all.iter().any(|p| p.contains("/node_modules/")), "{all:?}");
    let r = fs_ok(cp, s, "glob", json!({"path": R, "pattern": ".git/*"})).await?;
    assert_eq!(paths(&r, "matches").len(), 0);
    let r = fs_ok(
        cp,
        s,
        "glob",
        json!({"path": R, "pattern": "**/*.js", "exclude": ["node_modules"]}),
    )
    .await?;
    assert_eq!(paths(&r, "matches").len(), 0, "{r}");
    let r = fs_ok(
        cp,
        s,
        "glob",
        json!({"path": format!("{R}/README.md"), "pattern": "*"}),
    )
    .await?;
    assert_eq!(code(&r), Some("not_a_directory"));
    let r = fs_ok(
        cp,
        s,
        "glob",
        json!({"path": format!("{R}/nope"), "pattern": "*"}),
    )
    .await?;
    assert_eq!(code(&r), Some("not_found"));
    Ok(())
}

async fn grep(cp: &ControlPlane, s: &Session) -> Result<()> {
    let r = fs_ok(
        cp,
        s,
        "grep",
        json!({"path": R, "pattern": "hello (world|there)"}),
    )
    .await?;
    let mut got: Vec<String> = paths(&r, "matches");
    got.sort();
    assert_eq!(
        got,
        [
            format!("{R}/README.md"),
            format!("{R}/node_modules/dep/index.js"),
            format!("{R}/we:ird:1:name.txt"),
        ],
        "{r}"
    );
    assert_eq!(r["truncated"], false);
    let readme = r["matches"].as_array().and_then(|m| {
        m.iter()
            .find(|m| m["path"] == format!("{R}/README.md"))
            .cloned()
    });
    assert_eq!(
        readme,
        Some(json!({"path": format!("{R}/README.md"), "line": 2, "text": "hello world"}))
    );
    let r = fs_ok(
        cp,
        s,
        "grep",
        json!({"path": R, "pattern": "hello", "exclude": ["node_modules"], "glob": "*.md"}),
    )
    .await?;
    assert_eq!(paths(&r, "matches"), [format!("{R}/README.md")], "{r}");
    let r = fs_ok(
        cp,
        s,
        "grep",
        json!({"path": format!("{R}/src/app.py"), "pattern": "^def"}),
    )
    .await?;
    assert_eq!(
        r["matches"],
        json!([{"path": format!("{R}/src/app.py"), "line": 2, "text": "def main():"}])
    );
    let r = fs_ok(cp, s, "grep", json!({"path": R, "pattern": "a("})).await?;
    assert_eq!(code(&r), Some("invalid_pattern"), "{r}");
    let r = fs_ok(
        cp,
        s,
        "grep",
        json!({"path": format!("{R}/nope"), "pattern": "x"}),
    )
    .await?;
    assert_eq!(code(&r), Some("not_found"));
    // The 200-match cap.
    cp.sh(s, "mkdir -p /workspace/tmp/many && for i in $(seq 1 300); do echo needle; done > /workspace/tmp/many/f.txt").await?;
    let r = fs_ok(
        cp,
        s,
        "grep",
        json!({"path": "/workspace/tmp/many", "pattern": "needle"}),
    )
    .await?;
    assert_eq!(r["matches"].as_array().map(Vec::len), Some(200));
    assert_eq!(r["truncated"], true);
    Ok(())
}

async fn read(cp: &ControlPlane, s: &Session) -> Result<()> {
    let r = fs_ok(cp, s, "read", json!({"path": format!("{R}/ten.txt")})).await?;
    assert_eq!(
        r["content"],
        (1..=10)
            .map(|i| format!("line {i}"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    assert_eq!(
        (
            r["total_lines"].clone(),
            r["end_line"].clone(),
            r["truncated"].clone()
        ),
        (json!(10), json!(10), json!(false))
    );
    assert_eq!(r["encoding"], "utf-8");
    let r = fs_ok(
        cp,
        s,
        "read",
        json!({"path": format!("{R}/ten.txt"), "offset": 3, "limit": 2}),
    )
    .await?;
    assert_eq!(r["content"], "line 4\nline 5");
    assert_eq!(r["end_line"], 5);
    let r = fs_ok(
        cp,
        s,
        "read",
        json!({"path": format!("{R}/ten.txt"), "offset": 10}),
    )
    .await?;
    assert_eq!(code(&r), Some("invalid_offset"), "{r}");
    assert_eq!(
        (r["total_lines"].clone(), r["truncated"].clone()),
        (Value::Null, json!(false))
    );
    let r = fs_ok(cp, s, "read", json!({"path": format!("{R}/empty.txt")})).await?;
    assert_eq!(
        r["content"],
        "System reminder: File exists but has empty contents"
    );
    assert_eq!(
        (r["encoding"].clone(), r["total_lines"].clone()),
        (json!("utf-8"), Value::Null)
    );
    let r = fs_ok(cp, s, "read", json!({"path": format!("{R}/bin.dat")})).await?;
    assert_eq!(
        (r["encoding"].clone(), r["content"].clone()),
        (json!("base64"), json!(b64(b"\x00\xff\xfe binary")))
    );
    assert_eq!(r["end_line"], Value::Null);
    let r = fs_ok(cp, s, "read", json!({"path": format!("{R}/link.md")})).await?;
    assert_eq!(r["content"], "# Title\nhello world", "{r}");
    let r = fs_ok(cp, s, "read", json!({"path": format!("{R}/src")})).await?;
    assert_eq!(code(&r), Some("is_a_directory"));
    let r = fs_ok(cp, s, "read", json!({"path": format!("{R}/missing.txt")})).await?;
    assert_eq!(code(&r), Some("not_found"));
    // Over the cap: a text page is truncated with a marker; a binary file is refused.
    cp.sh(s, "cd /workspace/tmp && i=0; while [ $i -lt 700 ]; do printf '%01000d\\n' 0; i=$((i+1)); done > wide.txt && head -c 600000 /dev/zero > zeros.bin && echo x > locked.txt && chmod 000 locked.txt").await?;
    let r = fs_ok(cp, s, "read", json!({"path": "/workspace/tmp/wide.txt"})).await?;
    assert_eq!(r["truncated"], true, "{}", r["error"]);
    assert!(r["content"].as_str().unwrap_or_default().len() <= 512_000);
    assert_eq!(r["total_lines"], 700);
    assert!(r["end_line"].as_u64().is_some_and(|e| e > 400 && e < 512));
    let r = fs_ok(cp, s, "read", json!({"path": "/workspace/tmp/zeros.bin"})).await?;
    assert!(
        r["content"].as_str().is_some_and(|c| c.len() <= 512_000),
        "NULs are text for UTF-8"
    );
    cp.sh(s, "head -c 600000 /dev/urandom > /workspace/tmp/rand.bin")
        .await?;
    let r = fs_ok(cp, s, "read", json!({"path": "/workspace/tmp/rand.bin"})).await?;
    assert_eq!(code(&r), Some("too_large"), "{}", r["error"]);
    let r = fs_ok(cp, s, "read", json!({"path": "/workspace/tmp/locked.txt"})).await?;
    assert_eq!(code(&r), Some("permission_denied"), "{r}");
    Ok(())
}

async fn write_edit_delete(cp: &ControlPlane, s: &Session) -> Result<()> {
    let path = format!("{R}/new/dir/hello.sh");
    let r = fs_ok(
        cp,
        s,
        "write",
        json!({"path": path, "content": b64(b"echo hi\n"), "mode": 0o755}),
    )
    .await?;
    assert_eq!(r, json!({"ok": true, "error": null}));
    let (code_, out) = cp
        .sh(
            s,
            &format!(
                "stat -c '%u:%g %a' {path} {R}/new && sh {path} && echo \"$(id -u):$(id -g)\""
            ),
        )
        .await?;
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(code_, 0, "{out}");
    assert_eq!(lines[0], format!("{} 755", lines[3]), "{out}");
    assert_eq!(lines[1].split(' ').next(), Some(lines[3]), "{out}");
    assert_eq!(lines[2], "hi");
    let r = fs_ok(
        cp,
        s,
        "write",
        json!({"path": path, "content": b64(b"again")}),
    )
    .await?;
    assert_eq!(
        (code(&r), r["ok"].clone()),
        (Some("already_exists"), json!(false))
    );
    let r = fs_ok(
        cp,
        s,
        "write",
        json!({"path": format!("{R}/README.md/x"), "content": ""}),
    )
    .await?;
    // docs/api/workspace.md reserves not_a_directory for ls/glob on a file (DAIV's hint says
    // "read it").
    assert_eq!(code(&r), Some("exec_failed"), "{r}");
    cp.sh(
        s,
        "mkdir -p /workspace/tmp/ro && chmod 555 /workspace/tmp/ro",
    )
    .await?;
    let r = fs_ok(
        cp,
        s,
        "write",
        json!({"path": "/workspace/tmp/ro/f", "content": ""}),
    )
    .await?;
    assert_eq!(code(&r), Some("permission_denied"), "{r}");
    let (status, _) = fs(
        cp,
        s,
        "write",
        json!({"path": format!("{R}/bad"), "content": "@@not base64@@"}),
    )
    .await?;
    assert_eq!(status, 422);

    let app = format!("{R}/src/app.py");
    let r = fs_ok(
        cp,
        s,
        "edit",
        json!({"path": app, "old": "return 42", "new": "return 43"}),
    )
    .await?;
    assert_eq!(r, json!({"occurrences": 1, "error": null}));
    let r = fs_ok(cp, s, "read", json!({"path": app})).await?;
    assert!(
        r["content"]
            .as_str()
            .unwrap_or_default()
            .contains("return 43")
    );
    let r = fs_ok(cp, s, "edit", json!({"path": app, "old": "o", "new": "0"})).await?;
    assert_eq!(code(&r), Some("multiple_occurrences"), "{r}");
    let r = fs_ok(
        cp,
        s,
        "edit",
        json!({"path": app, "old": "o", "new": "0", "replace_all": true}),
    )
    .await?;
    assert!(r["occurrences"].as_u64().is_some_and(|n| n > 1), "{r}");
    let r = fs_ok(
        cp,
        s,
        "edit",
        json!({"path": app, "old": "zzz", "new": "y"}),
    )
    .await?;
    assert_eq!(code(&r), Some("string_not_found"));
    let r = fs_ok(
        cp,
        s,
        "edit",
        json!({"path": format!("{R}/noeol.txt"), "old": "end\n", "new": "fin\n"}),
    )
    .await?;
    assert_eq!(code(&r), Some("string_not_found"));
    assert!(
        r["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .contains("trailing newline"),
        "{r}"
    );
    let r = fs_ok(
        cp,
        s,
        "edit",
        json!({"path": format!("{R}/crlf.txt"), "old": "one\ntwo", "new": "uno\ndos"}),
    )
    .await?;
    assert_eq!(r["occurrences"], 1, "{r}");
    let (_, out) = cp.sh(s, &format!("od -c {R}/crlf.txt | head -1")).await?;
    assert!(
        out.contains("u   n   o  \\r  \\n   d   o   s  \\r  \\n"),
        "{out}"
    );
    let r = fs_ok(
        cp,
        s,
        "edit",
        json!({"path": format!("{R}/bin.dat"), "old": "binary", "new": "x"}),
    )
    .await?;
    assert_eq!(code(&r), Some("not_a_text_file"));
    let r = fs_ok(
        cp,
        s,
        "edit",
        json!({"path": format!("{R}/src"), "old": "a", "new": "b"}),
    )
    .await?;
    assert_eq!(code(&r), Some("is_a_directory"));
    let r = fs_ok(
        cp,
        s,
        "edit",
        json!({"path": format!("{R}/nope"), "old": "a", "new": "b"}),
    )
    .await?;
    assert_eq!(code(&r), Some("not_found"));
    let r = fs_ok(
        cp,
        s,
        "edit",
        json!({"path": "/workspace/tmp/locked.txt", "old": "x", "new": "y"}),
    )
    .await?;
    assert_eq!(code(&r), Some("permission_denied"), "{r}");

    let r = fs_ok(cp, s, "delete", json!({"path": path})).await?;
    assert_eq!(r, json!({"ok": true, "removed": true, "error": null}));
    let r = fs_ok(cp, s, "delete", json!({"path": path})).await?;
    assert_eq!(r, json!({"ok": true, "removed": false, "error": null}));
    let r = fs_ok(cp, s, "delete", json!({"path": format!("{R}/src")})).await?;
    assert_eq!(code(&r), Some("is_a_directory"));
    cp.sh(s, "touch /workspace/tmp/ro2 && mkdir -p /workspace/tmp/rodir && touch /workspace/tmp/rodir/f && chmod 555 /workspace/tmp/rodir").await?;
    let r = fs_ok(cp, s, "delete", json!({"path": "/workspace/tmp/rodir/f"})).await?;
    assert_eq!(code(&r), Some("permission_denied"), "{r}");
    Ok(())
}

async fn all_ops(image: &str) -> Result<()> {
    require_image(image);
    let cp = ControlPlane::start().await?;
    let s = seeded(&cp, image).await?;
    invalid_paths(&cp, &s).await?;
    ls_and_glob(&cp, &s).await?;
    grep(&cp, &s).await?;
    read(&cp, &s).await?;
    write_edit_delete(&cp, &s).await?;
    Ok(())
}

#[tokio::test]
async fn fs_ops_busybox() -> Result<()> {
    all_ops(BUSYBOX).await
}

#[tokio::test]
async fn fs_ops_debian() -> Result<()> {
    all_ops(DEBIAN).await
}

/// DAIV's file tools, every body checked against its wire schemas and every error code, on a
/// fork of a session from a snapshot of the seeded session: a workspace that is an overlay
/// over two layers (the seed's base layer, the middle session's changes) answers as a fresh
/// one does.
#[tokio::test]
async fn fs_ops_on_a_fork_of_a_session_from_a_snapshot() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    // The fork's own snapshot (no record) is the reaper's, which these tests leave off.
    let _guard = DeploymentGuard(cp.deployment.clone());
    let seeded = seeded(&cp, BUSYBOX).await?;
    let (st, b) = cp
        .call(
            Method::POST,
            &format!("/session/{}/snapshot/", seeded.id),
            Some(json!({})),
        )
        .await?;
    anyhow::ensure!(st == 201, "snapshot: {st} {b}");
    let snapshot = b["snapshot_id"].as_str().unwrap_or_default().to_string();
    let middle = cp.session(json!({ "snapshot_id": snapshot })).await?;
    // A change of its own, so the fork stands on two layers.
    let ran = cp
        .run(
            &middle,
            json!({"commands": ["echo middle > /workspace/repo/middle.txt"]}),
        )
        .await?;
    anyhow::ensure!(ran[0]["exit_code"] == 0, "{ran:?}");
    let (st, b) = cp
        .call(
            Method::POST,
            &format!("/session/{}/fork/", middle.id),
            Some(json!({"count": 1})),
        )
        .await?;
    anyhow::ensure!(st == 201, "fork: {st} {b}");
    let fork = Session {
        id: b["session_ids"][0].as_str().unwrap_or_default().to_string(),
    };
    // The middle session's file is there; the rest is the seeded session's own check, minus
    // that file (the listings count entries).
    let r = fs_ok(
        &cp,
        &fork,
        "read",
        json!({"path": "/workspace/repo/middle.txt"}),
    )
    .await?;
    anyhow::ensure!(r.to_string().contains("middle"), "{r}");
    fs_ok(
        &cp,
        &fork,
        "delete",
        json!({"path": "/workspace/repo/middle.txt"}),
    )
    .await?;
    invalid_paths(&cp, &fork).await?;
    ls_and_glob(&cp, &fork).await?;
    grep(&cp, &fork).await?;
    read(&cp, &fork).await?;
    write_edit_delete(&cp, &fork).await?;
    for s in [&fork, &middle, &seeded] {
        cp.force_close(s).await?;
    }
    let (st, b) = cp
        .call(Method::DELETE, &format!("/snapshots/{snapshot}/"), None)
        .await?;
    anyhow::ensure!(st == 204, "delete the snapshot: {st} {b}");
    Ok(())
}

/// A session seeded with `n` Python files in 50 directories (and as many READMEs beside them),
/// and a directory of `n` entries of its own: a repository the size DAIV works on.
async fn repository(cp: &ControlPlane, n: usize) -> Result<Session> {
    let names: Vec<String> = (0..n)
        .flat_map(|i| {
            [
                format!("pkg{:02}/mod_{i:05}.py", i % 50),
                format!("pkg{:02}/README_{i:05}.md", i % 50),
                format!("flat/f{i:05}.txt"),
            ]
        })
        .collect();
    let members: Vec<Member<'_>> = names
        .iter()
        .map(|name| Member::File(name, b"x = 1\n", 0o644))
        .collect();
    let s = cp.session_of(BUSYBOX).await?;
    let r = seed(cp, &s, vec![("repo_archive", gzip(&tar_of(&members)?)?)]).await?;
    anyhow::ensure!(r.status == 204, "seed: {r:?}");
    Ok(s)
}

/// Issue 41 #7: DAIV's agent globs `**/*.py` in a 5,000-file repository and gets all 5,000, as
/// the reference answers (it was 1,000 and a `truncated` DAIV's client does not read); an ls of
/// a 5,000-entry directory answers all of them too.
#[tokio::test]
async fn listings_answer_every_entry() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = repository(&cp, 5_000).await?;
    let r = fs_ok(&cp, &s, "glob", json!({"path": R, "pattern": "**/*.py"})).await?;
    let got = paths(&r, "matches");
    let mut want: Vec<String> = (0..5_000)
        .map(|i| format!("{R}/pkg{:02}/mod_{i:05}.py", i % 50))
        .collect();
    want.sort();
    assert_eq!(got.len(), 5_000);
    assert_eq!(got, want);
    assert_eq!(
        r.get("truncated"),
        None,
        "DAIV's FsGlobResponse has no such field"
    );
    assert_eq!(r["error"], Value::Null);

    let r = fs_ok(&cp, &s, "ls", json!({"path": format!("{R}/flat")})).await?;
    let got = paths(&r, "entries");
    let want: Vec<String> = (0..5_000)
        .map(|i| format!("{R}/flat/f{i:05}.txt"))
        .collect();
    assert_eq!(got, want);
    assert_eq!(r.get("truncated"), None);
    // The whole repository: 50 directories, 10,000 files below them, the flat one's 5,000.
    let r = fs_ok(&cp, &s, "glob", json!({"path": R, "pattern": "**"})).await?;
    assert_eq!(paths(&r, "matches").len(), 15_051, "{}", r["error"]);
    Ok(())
}

/// A listing over `FS_LIST_MAX_BYTES` is the error `too_large`, with nothing of it answered;
/// one within it is whole.
#[tokio::test]
async fn a_listing_over_its_byte_bound_is_too_large() -> Result<()> {
    require_image(BUSYBOX);
    // 5,000 entries of `{"path":"/workspace/repo/flat/f00000.txt","is_dir":false}` and a
    // comma: 58 bytes each, 290,000 in all (the Python files' are 61 bytes each).
    let cp = ControlPlane::start_with(&[("FS_LIST_MAX_BYTES", "290000")]).await?;
    let s = repository(&cp, 5_000).await?;
    let flat = json!({"path": format!("{R}/flat")});
    let r = fs_ok(&cp, &s, "ls", flat.clone()).await?;
    assert_eq!(paths(&r, "entries").len(), 5_000, "{}", r["error"]);
    let r = fs_ok(&cp, &s, "glob", json!({"path": R, "pattern": "flat/*"})).await?;
    assert_eq!(paths(&r, "matches").len(), 5_000, "{}", r["error"]);
    // Over it: the error, no entry.
    let r = fs_ok(&cp, &s, "glob", json!({"path": R, "pattern": "**/*.py"})).await?;
    assert_eq!(code(&r), Some("too_large"), "{}", r["error"]);
    assert_eq!(r["matches"], json!([]));
    let message = r["error"]["message"].as_str().unwrap_or_default();
    assert!(message.contains("290000-byte limit"), "{message}");
    assert!(
        message.contains("narrow the path or the pattern"),
        "{message}"
    );
    let (c, out) = cp.sh(&s, "touch /workspace/repo/flat/g.txt").await?;
    assert_eq!((c, out.as_str()), (0, ""));
    let r = fs_ok(&cp, &s, "ls", flat).await?;
    assert_eq!(code(&r), Some("too_large"), "{}", r["error"]);
    assert_eq!(r["entries"], json!([]));
    Ok(())
}

/// The service's memory while a listing of about 25 MB streams through it (100,000 files with
/// 200-character names): the answer passes a chunk at a time, so its resident memory grows by a
/// few MiB, not by the answer. The numbers are printed (`--nocapture`).
#[tokio::test]
async fn a_huge_listing_streams_through_flat_memory() -> Result<()> {
    require_image(BUSYBOX);
    let cp = ControlPlane::start().await?;
    let s = cp.session_of(BUSYBOX).await?;
    let long = "n".repeat(200);
    let (c, out) = cp
        .sh(
            &s,
            &format!(
                "mkdir -p /workspace/tmp/huge && cd /workspace/tmp/huge && seq 100000 | sed 's/$/_{long}/' | xargs touch && ls | wc -l"
            ),
        )
        .await?;
    assert_eq!((c, out.trim()), (0, "100000"), "{out}");
    // Warm: one listing first, so what is measured is the streaming, not first allocations.
    let small = json!({"path": "/workspace/tmp", "pattern": "*"});
    fs_ok(&cp, &s, "glob", small).await?;
    let before = cp.rss_kib().unwrap_or(0);
    let stop = Arc::new(AtomicBool::new(false));
    let peak = Arc::new(AtomicU64::new(before));
    let sampler = {
        let (stop, peak, pid) = (stop.clone(), peak.clone(), cp.pid());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Some(kib) = std::fs::read_to_string(format!("/proc/{pid}/status"))
                    .ok()
                    .and_then(|s| {
                        s.lines()
                            .find(|l| l.starts_with("VmRSS:"))
                            .and_then(|l| l.split_whitespace().nth(1))
                            .and_then(|v| v.parse::<u64>().ok())
                    })
                {
                    peak.fetch_max(kib, Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(10));
            }
        })
    };
    let started = std::time::Instant::now();
    let (status, body) = cp
        .call(
            reqwest::Method::POST,
            &format!("/session/{}/fs/glob", s.id),
            Some(json!({"path": "/workspace/tmp/huge", "pattern": "*"})),
        )
        .await?;
    let took = started.elapsed();
    stop.store(true, Ordering::Relaxed);
    let _ = sampler.join();
    assert_eq!(status, 200);
    let matches = body["matches"].as_array().cloned().unwrap_or_default();
    assert_eq!(matches.len(), 100_000, "{}", body["error"]);
    let answer = serde_json::to_vec(&body)?.len() as u64;
    let peak = peak.load(Ordering::Relaxed);
    eprintln!(
        "glob of 100,000 entries: {answer} bytes in {took:?}; service RSS {before} KiB before, {peak} KiB peak (+{} KiB)",
        peak.saturating_sub(before)
    );
    // Flat: the growth is a small part of the answer (which held whole would be all of it,
    // and more as parsed entries).
    assert!(
        (peak.saturating_sub(before)) * 1024 < answer / 3,
        "RSS grew from {before} to {peak} KiB for a {answer}-byte answer"
    );
    Ok(())
}
